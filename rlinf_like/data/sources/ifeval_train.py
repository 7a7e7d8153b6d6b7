"""`data.source=ifeval_train`: verifiable-instruction prompts for RL, held out against the official IFEval prompts.

A training prompt is a base request (a request template filled with a topic, both written here) followed by one to
three constraints. Each constraint is an official checker type with kwargs drawn here; its wording is the checker's
own `build_description` (lm-eval's copy of Google's checkers), and `reward.fn=ifeval` scores it with the same
checker. Types that conflict (lowercase and all capitals, JSON and almost anything) are never drawn together, by
the checkers' own conflict table.

The held-out set is the official prompts (`rlinf_like/data/ifeval_data/`) whose every instruction is a trained type,
so `eval_accuracy` is IFEval's prompt-level loose accuracy on those prompts. No generated prompt equals an official one,
and no base request occurs inside one (`load` refuses the pool otherwise; tests/test_ifeval.py checks it).

`data.options` holds the generator's settings: `types` (instruction ids or groups such as `change_case`; default
`DEFAULT_TYPES`), `min_constraints` and `max_constraints` (1 and 3), `pool` (how many prompts to generate, 4000).
"""

from __future__ import annotations

import random

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.data.tasks import Problem

# The types a 135M model can be taught here: everything but a response in another language (the model cannot
# write one) and the three that take over the whole answer (JSON, a fixed option, two answers), which conflict
# with nearly every other type.
DEFAULT_TYPES = (
    "keywords:existence", "keywords:frequency", "keywords:forbidden_words", "keywords:letter_frequency",
    "length_constraints:number_sentences", "length_constraints:number_paragraphs", "length_constraints:number_words",
    "length_constraints:nth_paragraph_first_word", "detectable_content:number_placeholders",
    "detectable_content:postscript", "detectable_format:number_bullet_lists",
    "detectable_format:number_highlighted_sections", "detectable_format:multiple_sections", "detectable_format:title",
    "combination:repeat_prompt", "startend:end_checker", "startend:quotation", "change_case:capital_word_frequency",
    "change_case:english_capital", "change_case:english_lowercase", "punctuation:no_comma")
OPTIONS = {"types": list(DEFAULT_TYPES), "min_constraints": 1, "max_constraints": 3, "pool": 4000}

TOPICS = (
    "a rainy afternoon in a small town", "the history of the bicycle", "learning to play the violin",
    "a robot that wants to become a chef", "why people keep houseplants", "the first day at a new job",
    "saving money as a student", "a lighthouse keeper's evening", "the life cycle of a butterfly",
    "a visit to a farmers' market", "how bridges stay up", "a friendship between a cat and a crow",
    "the benefits of walking every day", "a city without cars", "the smell of fresh bread",
    "planning a camping trip", "the moon landing", "a library that never closes", "how bees make honey",
    "moving to a new country", "a forgotten umbrella", "the rules of chess", "a train journey through mountains",
    "why the sky is blue", "a dragon who is afraid of fire", "cooking dinner for friends", "the ocean at night",
    "a museum of lost socks", "how to care for a puppy", "the invention of the printing press", "winter mornings",
    "a school garden", "recycling plastic", "a detective who solves crimes with smells", "the importance of sleep",
    "a marathon runner's last mile", "volcanoes", "an old map found in an attic", "learning a second language",
    "the water cycle", "a picnic interrupted by ants", "building a treehouse", "the future of electric cars",
    "a time traveller at a medieval fair", "the stars in the desert", "a bakery run by twins",
    "how to make a paper plane", "the first snowfall of the year", "a penguin who wants to fly",
    "working from home", "the invention of the telephone", "a quiet village by a lake", "the joy of reading",
    "a space station's kitchen", "keeping a diary", "a storm at sea", "the history of chocolate",
    "a new smartphone app for gardeners", "an elephant's memory", "how rainbows form", "a street musician",
    "the last day of summer holidays", "a wizard who lost his hat", "healthy breakfast ideas", "the Great Wall",
    "a haunted bookshop", "teaching a parrot to talk", "desert plants", "a football match in the rain",
    "the invention of glasses", "a lost key", "a family road trip", "how clocks work", "a dog's first snow",
    "coffee shops", "an astronaut's letter home", "the pyramids", "a kite festival", "mountain goats",
)
REQUESTS = (
    "Write a short story about {topic}.", "Write a poem about {topic}.", "Write a blog post about {topic}.",
    "Describe {topic} to a ten-year-old.", "Write a letter to a friend about {topic}.",
    "Write a product description inspired by {topic}.", "Give some advice related to {topic}.",
    "Write a diary entry about {topic}.", "Write a speech about {topic}.", "Explain {topic} in simple words.",
    "Write a song about {topic}.", "Write a news report about {topic}.", "Write a riddle about {topic}.",
    "Write a short essay on {topic}.", "Write an advertisement about {topic}.",
    "Summarize what you know about {topic}.", "Write a funny dialogue about {topic}.",
    "Write a limerick about {topic}.", "Write a review of a film about {topic}.",
    "Write a travel guide entry about {topic}.",
)
END_PHRASES = ("Is there anything else I can help with?", "Any other questions?", "That is all for today.",
               "Thank you for reading.", "Let me know what you think.", "Have a nice day!")
LETTERS = "abcdefghilmnoprstuwy"


def _kwargs(iid: str, rng: random.Random, words: list[str], topic: str) -> dict:
    """The kwargs one constraint of type `iid` is built with (ranges chosen here; the official ones differ)."""
    rel = rng.choice(("less than", "at least"))
    kind = iid.split(":")[1]
    if kind == "existence":
        return {"keywords": rng.sample(words, rng.randint(1, 2))}
    if kind == "frequency":
        return {"keyword": rng.choice(words), "frequency": rng.randint(1, 3), "relation": rel}
    if kind == "forbidden_words":
        own = [w for w in topic.split() if len(w) > 3 and w.isalpha()]
        return {"forbidden_words": sorted(set(rng.sample(own, min(len(own), 1)) + rng.sample(words, 1)))}
    if kind == "letter_frequency":
        return {"letter": rng.choice(LETTERS), "let_frequency": rng.randint(2, 10), "let_relation": rel}
    if kind == "number_sentences":
        return {"num_sentences": rng.randint(2, 8), "relation": rel}
    if kind == "number_paragraphs":
        return {"num_paragraphs": rng.randint(2, 4)}
    if kind == "number_words":
        return {"num_words": rng.choice((30, 50, 80, 100, 150)), "relation": rel}
    if kind == "nth_paragraph_first_word":
        n = rng.randint(2, 3)
        return {"num_paragraphs": n, "nth_paragraph": rng.randint(1, n), "first_word": rng.choice(words)}
    if kind == "number_placeholders":
        return {"num_placeholders": rng.randint(1, 3)}
    if kind == "postscript":
        return {"postscript_marker": rng.choice(("P.S.", "P.P.S"))}
    if kind == "number_bullet_lists":
        return {"num_bullets": rng.randint(2, 5)}
    if kind == "number_highlighted_sections":
        return {"num_highlights": rng.randint(1, 3)}
    if kind == "multiple_sections":
        return {"section_spliter": rng.choice(("Section", "SECTION")), "num_sections": rng.randint(2, 4)}
    if kind == "end_checker":
        return {"end_phrase": rng.choice(END_PHRASES)}
    if kind == "capital_word_frequency":
        return {"capital_frequency": rng.randint(2, 5), "capital_relation": rel}
    return {}  # title, quotation, english_capital, english_lowercase, no_comma, repeat_prompt (set by the caller)


def _conflicts(a: str, b: str) -> bool:
    from rlinf_like.data.ifeval_checks import registry

    table = registry().INSTRUCTION_CONFLICTS
    return a == b or b in table.get(a, ()) or a in table.get(b, ())


def resolve_types(types) -> list[str]:
    """Instruction ids from ids and groups (`change_case` means every `change_case:*`), refusing unknown ones."""
    from rlinf_like.data.ifeval_checks import instruction_ids

    known = instruction_ids()
    out = []
    for t in types:
        matched = [iid for iid in known if iid == t or iid.split(":")[0] == t]
        if not matched:
            raise ValueError(f"data.options.types: {t!r} is not an IFEval instruction id or group; choose from {known}")
        out += [m for m in matched if m not in out]
    return out


def generate(n: int, seed: int, types: list[str], min_constraints: int = 1, max_constraints: int = 3) -> list[dict]:
    """`n` rows like the official data's: `prompt`, `instruction_id_list`, `kwargs`, and the `request` they extend."""
    from rlinf_like.data.ifeval_checks import registry

    checkers = registry()
    words = sorted(checkers.instructions.instructions_util.WORD_LIST)
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        topic = rng.choice(TOPICS)
        request = rng.choice(REQUESTS).format(topic=topic)
        chosen: list[str] = []
        wanted = rng.randint(min_constraints, max_constraints)
        for iid in rng.sample(types, len(types)):
            if len(chosen) == wanted:
                break
            if not any(_conflicts(iid, c) for c in chosen):
                chosen.append(iid)
        chosen.sort(key=lambda iid: iid == "combination:repeat_prompt")  # it repeats what comes before it
        parts, kwargs = [request], []
        for iid in chosen:
            kw = {"prompt_to_repeat": " ".join(parts)} if iid == "combination:repeat_prompt" else \
                _kwargs(iid, rng, words, topic)
            parts.append(checkers.INSTRUCTION_DICT[iid](iid).build_description(**kw))
            kwargs.append(kw)
        rows.append({"prompt": " ".join(parts), "instruction_id_list": chosen, "kwargs": kwargs, "request": request})
    return rows


def _problem(row: dict) -> Problem:
    return Problem(prompt=row["prompt"], answer="",
                   fields={"instruction_id_list": list(row["instruction_id_list"]), "kwargs": list(row["kwargs"])})


def check_held_out(pool: list[dict], official: list[dict]) -> None:
    """Raises if a generated prompt is an official one, or a base request occurs inside one."""
    texts = [r["prompt"] for r in official]
    same = {r["prompt"] for r in pool} & set(texts)
    inside = sorted({r["request"] for r in pool if any(r["request"] in t for t in texts)})
    if same or inside:
        raise ValueError(f"data.source=ifeval_train generated official IFEval prompts: {sorted(same)[:3]} "
                         f"{inside[:3]}")


class IFEvalTrainSource(DataSource):
    keys = ("options", "test_problems")
    default_reward = "ifeval"

    @classmethod
    def load(cls, cfg) -> Tasks:
        from rlinf_like.data.ifeval_checks import official_prompts

        unknown = sorted(set(cfg.options) - set(OPTIONS))
        if unknown:
            raise ValueError(f"data.options has {unknown}, which data.source=ifeval_train does not read; it reads "
                             f"{sorted(OPTIONS)}")
        opts = {**OPTIONS, **cfg.options}
        types = resolve_types(opts["types"])
        lo, hi = int(opts["min_constraints"]), int(opts["max_constraints"])
        if not 1 <= lo <= hi:
            raise ValueError(f"data.options: need 1 <= min_constraints <= max_constraints, got {lo} and {hi}")
        pool = generate(int(opts["pool"]), cfg.seed, types, lo, hi)
        official = official_prompts()
        check_held_out(pool, official)
        trained = set(types)
        test = [r for r in official if set(r["instruction_id_list"]) <= trained][: cfg.test_problems]
        return Tasks(sft=[], test=[_problem(r) for r in test], pool=[_problem(r) for r in pool], epochs=True)
