"""Writes the search tool's example corpus and its question set: invented places and people with invented facts,
so a model can answer only by searching (in the spirit of Search-R1, without its Wikipedia dump).

    python rlinf_like/envs/tools/data/make_corpus.py    # rewrites both files, the same bytes every time

- `rlinf_like/envs/tools/data/search_corpus.jsonl`: 300 passages {"id", "title", "text"}
- `examples/agentic/data/search_qa.jsonl`: 300 rows {"question", "answer"}, one per passage; each answer is one
  word (an invented name or a number) found in exactly one passage, and the question names that passage's entity,
  so that BM25 ranks the passage first (both checked here before writing).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
CORPUS_PATH = ROOT / "rlinf_like/envs/tools/data/search_corpus.jsonl"
QA_PATH = ROOT / "examples/agentic/data/search_qa.jsonl"
PER_KIND = 60
SEED = 2024

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr", "kr", "st", "th",
          "tr", "vr", "sk", "hal", "qu"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ou", "y"]
CODAS = ["", "", "n", "r", "l", "s", "th", "nd", "rn", "sk", "lt", "m"]
REGIONS = ["Quelmar", "Ostravin", "Belthune", "Caskaro", "Dunmerrow", "Elvaspen", "Fennagh", "Gorsvale"]

# (kind, title, text, [(question, answer) for each fact]); {name}, {a}, {b}, {c} are invented, {n} a number
KINDS = {
    "town": ("{name}",
             "{name} is a market town in the {region} lowlands. It was founded in {n} by a cooper named {a}. The town "
             "is famous for a honey pastry called {b}, which is baked for its yearly lantern fair.",
             [("In which year was the town of {name} founded?", "{n}"), ("Who founded the town of {name}?", "{a}"),
              ("What honey pastry is the town of {name} famous for?", "{b}")]),
    "river": ("{name} (river)",
              "The {name} is a river that rises in the {region} hills and runs {n} kilometres to the sea. A silver "
              "fish called the {a} lives only in its waters, and the boatmen on the {name} sing an old song called "
              "{b}.",
              [("How many kilometres long is the river {name}?", "{n}"),
               ("Which silver fish lives only in the river {name}?", "{a}"),
               ("What song do the boatmen on the river {name} sing?", "{b}")]),
    "mountain": ("Mount {name}",
                 "Mount {name} is a peak in the {region} range, {n} metres high. It was first climbed by a shepherd "
                 "named {a}, and a blue flower called {b} grows only near its summit.",
                 [("How many metres high is Mount {name}?", "{n}"), ("Who first climbed Mount {name}?", "{a}"),
                  ("Which blue flower grows near the summit of Mount {name}?", "{b}")]),
    "astronomer": ("{name} {c}",
                   "{name} {c} was an astronomer from {region}, born in the village of {a}. She found {n} variable "
                   "stars, discovered a comet that she named {b}, and kept her notes in a cipher of her own.",
                   [("How many variable stars did the astronomer {name} {c} find?", "{n}"),
                    ("In which village was the astronomer {name} {c} born?", "{a}"),
                    ("What did the astronomer {name} {c} name the comet she discovered?", "{b}")]),
    "lake": ("Lake {name}",
             "Lake {name} is a cold lake in {region} whose deepest point lies {n} metres below the surface. Its "
             "largest island is called {a}, and a ferry named the {b} crosses it twice a day.",
             [("How deep is Lake {name}, in metres?", "{n}"),
              ("What is the largest island in Lake {name} called?", "{a}"),
              ("What is the name of the ferry that crosses Lake {name}?", "{b}")]),
}
NUMBER_RANGE = {"town": (1100, 1899), "river": (40, 990), "mountain": (1200, 4800), "astronomer": (12, 999),
                "lake": (30, 990)}


def invented_words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS) for _ in range(rng.choice([2, 3])))
        if 5 <= len(word) <= 11 and word not in taken:
            taken.add(word)
            words.append(word.capitalize())
    return words


def build() -> tuple[list[dict], list[dict]]:
    rng = random.Random(SEED)
    template_words = {w.lower() for kind in KINDS.values() for part in (kind[1], *[q for q, _ in kind[2]])
                      for w in re.findall(r"[A-Za-z]+", part)}
    taken = template_words | {r.lower() for r in REGIONS}
    numbers_taken: set[int] = set()
    passages, questions = [], []
    for kind, (title_t, text_t, facts) in KINDS.items():
        for i in range(PER_KIND):
            name, a, b, c = invented_words(rng, 4, taken)
            low, high = NUMBER_RANGE[kind]
            n = rng.choice([x for x in range(low, high + 1) if x not in numbers_taken])
            numbers_taken.add(n)
            values = {"name": name, "a": a, "b": b, "c": c, "n": n, "region": rng.choice(REGIONS)}
            passages.append({"id": f"{kind}-{i:03d}", "title": title_t.format(**values),
                             "text": text_t.format(**values)})
            question, answer = facts[(len(passages) - 1) % len(facts)]  # each fact type in turn
            questions.append({"question": question.format(**values), "answer": answer.format(**values)})
    return passages, questions


def check(passages: list[dict], questions: list[dict]) -> None:
    """Each answer is in exactly one passage, and BM25 ranks that passage first for the question."""
    from rlinf_like.envs.tools.search import corpus_index

    index = corpus_index(CORPUS_PATH)
    for row in questions:
        pattern = re.compile(rf"\b{re.escape(row['answer'])}\b", re.IGNORECASE)
        holders = [p for p in passages if pattern.search(f"{p['title']} {p['text']}")]
        assert len(holders) == 1, f"{row['answer']!r} is in {len(holders)} passages"
        best = index.search(row["question"], 1)[0][0]
        assert best.id == holders[0]["id"], f"{row['question']!r}: BM25 ranks {best.id} first, not {holders[0]['id']}"


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def main() -> None:
    passages, questions = build()
    write_jsonl(CORPUS_PATH, passages)
    write_jsonl(QA_PATH, questions)
    check(passages, questions)
    print(f"{len(passages)} passages -> {CORPUS_PATH.relative_to(ROOT)}, "
          f"{len(questions)} questions -> {QA_PATH.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
