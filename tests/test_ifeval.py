"""IFEval (issue 50): the official prompts shipped unchanged, the official checkers' verdicts offline, a training-prompt
generator that never shows an evaluation prompt, the reward, the evaluation command, and the preset's first steps."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_like.data.config import DataConfig
from rlinf_like.data.sources import load_tasks
from rlinf_like.data.sources.ifeval_train import DEFAULT_TYPES, check_held_out, generate, resolve_types
from rlinf_like.eval import ifeval
from rlinf_like.data.ifeval_checks import PROMPTS, check, official_prompts, punkt_source
from rlinf_like.workers.reward.builtin import ifeval_all_reward, ifeval_reward

ROOT = Path(__file__).resolve().parents[1]

# One row per trained instruction type: its kwargs, a response the official checker passes and one it fails
# (hand-made; the verdicts are what Google's checkers define).
CASES = [
    ("keywords:existence", {"keywords": ["river", "stone"]}, "A stone fell into the River.", "A rock fell in."),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "at least"}, "cat and Cat", "one cat"),
    ("keywords:frequency", {"keyword": "cat", "frequency": 2, "relation": "less than"}, "one cat", "cat, cat"),
    ("keywords:forbidden_words", {"forbidden_words": ["rain"]}, "It was sunny; raining later.", "Rain came."),
    ("keywords:letter_frequency", {"letter": "z", "let_frequency": 2, "let_relation": "at least"}, "zig zag",
     "zebra"),
    ("length_constraints:number_sentences", {"num_sentences": 3, "relation": "less than"},
     "Dr. Smith came home. He slept.", "One. Two. Three."),
    ("length_constraints:number_paragraphs", {"num_paragraphs": 2}, "First part.\n***\nSecond part.",
     "First.\n***\nSecond.\n***\nThird."),
    ("length_constraints:number_words", {"num_words": 5, "relation": "at least"}, "one two three four five",
     "one two three"),
    ("length_constraints:nth_paragraph_first_word", {"num_paragraphs": 2, "nth_paragraph": 2, "first_word": "then"},
     "First it rained.\n\nThen it stopped.", "First it rained.\n\nLater it stopped."),
    ("detectable_content:number_placeholders", {"num_placeholders": 2}, "Dear [name], at [address].",
     "Dear [name]."),
    ("detectable_content:postscript", {"postscript_marker": "P.S."}, "Hello.\n\nP.S. See you soon.", "Hello."),
    ("detectable_format:number_bullet_lists", {"num_bullets": 2}, "* apples\n* pears", "* apples\n* pears\n* figs"),
    ("detectable_format:number_highlighted_sections", {"num_highlights": 2}, "*one* and *two*", "*one* only"),
    ("detectable_format:multiple_sections", {"section_spliter": "SECTION", "num_sections": 2},
     "SECTION 1\nhello\nSECTION 2\nbye", "SECTION 1\nhello"),
    ("detectable_format:title", {}, "<<A Day Out>>\nWe went out.", "A Day Out\nWe went out."),
    ("combination:repeat_prompt", {"prompt_to_repeat": "Write a poem about rain."},
     "Write a poem about rain. Rain falls softly.", "Here is a poem: Rain falls softly."),
    ("startend:end_checker", {"end_phrase": "Any other questions?"}, "Here it is. Any other questions?",
     "Any other questions? Here it is."),
    ("startend:quotation", {}, '"All of it quoted."', 'Not "all" of it quoted.'),
    ("change_case:capital_word_frequency", {"capital_frequency": 2, "capital_relation": "at least"},
     "This is VERY VERY important.", "This is VERY important."),
    ("change_case:english_capital", {}, "THIS IS WRITTEN IN ENGLISH AND ALL IN CAPITAL LETTERS.",
     "This is written in English but not in capitals."),
    ("change_case:english_lowercase", {}, "this is written in english and all in lowercase letters.",
     "This is written in English but not in lowercase."),
    ("punctuation:no_comma", {}, "No commas here at all.", "Well, a comma."),
]


def test_the_official_prompts_ship_unchanged():
    data = PROMPTS.read_bytes()
    assert len(data) == 207_111
    assert hashlib.sha256(data).hexdigest() == "67ffeee0fcb87c317c5b08a2de85557b4a7e96ada6178aa645b4954fe4b53d49"
    rows = official_prompts()
    assert len(rows) == 541 and len({r["key"] for r in rows}) == 541
    assert len({i for r in rows for i in r["instruction_id_list"]}) == 25
    assert (PROMPTS.parent / "LICENSE-ifeval").read_text().lstrip().startswith("Apache License")


@pytest.mark.parametrize("iid,kwargs,good,bad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_the_official_checkers_give_the_published_verdicts(iid, kwargs, good, bad):
    row = {"prompt": "Write something.", "instruction_id_list": [iid], "kwargs": [kwargs]}
    assert check(row, good).strict == (True,), good
    assert check(row, bad).strict == (False,), bad


def test_every_trained_type_has_a_case_and_loose_forgives_what_strict_does_not():
    assert set(DEFAULT_TYPES) == {c[0] for c in CASES}
    row = {"prompt": "x", "instruction_id_list": ["startend:quotation", "punctuation:no_comma"], "kwargs": [{}, {}]}
    verdict = check(row, 'Sure, here it is:\n"All quoted and no commas"')  # an opening line, and a comma in it
    assert verdict.strict == (False, False) and verdict.loose == (True, True)
    assert not verdict.prompt_strict and verdict.prompt_loose
    # sentence splitting works offline (this package's Punkt parameters unless NLTK's are installed)
    assert "substitute" in punkt_source() or "NLTK's" in punkt_source()


def test_the_generator_never_emits_an_official_prompt_and_is_a_function_of_its_seed():
    official = official_prompts()
    rows = generate(3000, seed=0, types=list(DEFAULT_TYPES))
    check_held_out(rows, official)  # no prompt equal to an official one, no base request inside one
    assert generate(50, seed=0, types=list(DEFAULT_TYPES)) == rows[:50]
    assert generate(50, seed=1, types=list(DEFAULT_TYPES)) != rows[:50]
    from rlinf_like.data.ifeval_checks import registry

    conflicts = registry().INSTRUCTION_CONFLICTS
    for r in rows:
        ids = r["instruction_id_list"]
        assert 1 <= len(ids) <= 3 and set(ids) <= set(DEFAULT_TYPES)
        assert not any(b in conflicts.get(a, ()) for a in ids for b in ids if a != b), ids
        if "combination:repeat_prompt" in ids:  # the request to repeat is everything before the instruction
            assert ids[-1] == "combination:repeat_prompt"
            assert r["prompt"].startswith(r["kwargs"][-1]["prompt_to_repeat"])
    with pytest.raises(ValueError, match="generated official IFEval prompts"):
        check_held_out(rows[:5] + [{"prompt": official[3]["prompt"], "request": "zz"}], official)


def test_the_source_holds_out_official_prompts_of_the_trained_types_and_refuses_bad_options():
    tasks = load_tasks(DataConfig(source="ifeval_train", test_problems=1000,
                                  options={"types": ["punctuation", "change_case:english_lowercase"], "pool": 200}))
    wanted = {"punctuation:no_comma", "change_case:english_lowercase"}
    expected = [r["prompt"] for r in official_prompts() if set(r["instruction_id_list"]) <= wanted]
    assert [p.prompt for p in tasks.test] == expected and len(expected) > 20
    assert len(tasks.pool) == 200 and not tasks.sft
    assert all(set(p.fields["instruction_id_list"]) <= wanted for p in tasks.pool)
    with pytest.raises(ValueError, match=r"data.options.types: 'casing' is not an IFEval instruction id or group"):
        resolve_types(["casing"])
    with pytest.raises(ValueError, match=r"data.options has \['typos'\]"):
        load_tasks(DataConfig(source="ifeval_train", options={"typos": ["x"]}))


def test_the_reward_is_the_share_followed_or_all_or_nothing():
    fields = {"instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]}
    half = ifeval_reward("no commas, oops", "", **fields)
    assert half["reward"] == 0.0 and not half["correct"]
    one = ifeval_reward('"quoted, with a comma"', "", **fields)
    assert one["reward"] == 0.5 and one["ifeval/inst_strict"] == 0.5 and not one["correct"]
    # IFEval's loose check also reads the response without its first line: the quotation then holds
    loose = ifeval_reward('Sure:\n"quoted and clean"', "", **fields)
    assert (loose["ifeval/prompt_strict"], loose["ifeval/inst_strict"]) == (0.0, 0.5)
    assert (loose["ifeval/prompt_loose"], loose["ifeval/inst_loose"]) == (1.0, 1.0) and loose["correct"]
    assert ifeval_all_reward('"quoted, with a comma"', "", **fields)["reward"] == 0.0
    full = ifeval_all_reward('"quoted and clean"', "", **fields)
    assert full["reward"] == 1.0 and full["correct"] and full["formatted"]
    with pytest.raises(ValueError, match="data.source=ifeval_train"):
        ifeval_reward("x", "")


def test_select_and_score_count_prompts_and_instructions():
    rows = ifeval.select(official_prompts(), ["punctuation"], limit=None)
    assert rows and all(any(i.startswith("punctuation:") for i in r["instruction_id_list"]) for r in rows)
    two = [{"prompt": "a", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
           {"prompt": "b", "instruction_id_list": ["punctuation:no_comma", "startend:quotation"], "kwargs": [{}, {}]}]
    report = ifeval.score(two, ["fine", "fine, not quoted"])
    assert report.scores == {"prompt_strict": 0.5, "inst_strict": 1 / 3, "prompt_loose": 0.5, "inst_loose": 1 / 3}
    assert report.by_type["punctuation:no_comma"] == (2, 0.5, 0.5)


@pytest.mark.real_model
def test_the_evaluation_command_is_deterministic_and_refuses_bad_arguments(real_model_path, tmp_path, capsys):
    args = [real_model_path, "--limit", "3", "--max-new-tokens", "12"]
    first = ifeval.main([*args, "--out", str(tmp_path / "a.jsonl")])
    second = ifeval.main([*args, "--out", str(tmp_path / "b.jsonl")])
    assert first == second and set(first) == set(ifeval.SCORES)
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    lines = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [x["key"] for x in lines] == [r["key"] for r in official_prompts()[:3]]
    out = capsys.readouterr().out
    assert "prompt_strict" in out and "instruction" in out and "host:" in out
    for bad, message in ((["--limit", "0"], "--limit must be >= 1"), (["--types", "nope"], "selects no prompt")):
        with pytest.raises(SystemExit):
            ifeval.main([real_model_path, *bad])
        assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ifeval.main([str(tmp_path)])
    assert "is not a model folder" in capsys.readouterr().err


@pytest.mark.real_model
def test_the_preset_runs_a_step_in_process_on_the_real_model(real_model_8l_path, tmp_path):
    """The preset's wiring (its data, reward, held-out scores and their TensorBoard group) on SmolLM2's first 8
    layers: the real tokenizer, chat template and checkpoint layout, a third of the compute."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    small = ["runner.max_steps=1", "runner.eval_every=1", "runner.save_every=1", "runner.prompts_per_step=2",
             "algorithm.samples_per_prompt=2", "runner.max_new_tokens=24", "data.test_problems=4",
             "+data.options.pool=100", "cluster.backend=local", "cluster.component_placement.actor=0",
             "cluster.component_placement.rollout=0", f"runner.output_dir={out}", f"model.path={real_model_8l_path}"]
    done = subprocess.run([sys.executable, "examples/reasoning/main_grpo.py", "--config-name", "grpo_ifeval_smollm2",
                           *small], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = json.loads((out / "checkpoint/runner.json").read_text())["history"]
    assert [h["step"] for h in history] == [0, 1]
    for h in history[1:]:
        assert 0.0 <= h["reward"] <= 1.0 and 0.0 <= h["reward/ifeval/inst_strict"] <= 1.0
    # the held-out set's four IFEval scores, prompt level the accuracy and format rate, in a TensorBoard group
    # `ifeval/` of their own, the closing table and the plot
    for h in history:
        assert h["ifeval/prompt_loose"] == h["eval_accuracy"] and h["ifeval/prompt_strict"] == h["eval_format_rate"]
        assert h["ifeval/prompt_strict"] <= h["ifeval/inst_strict"] <= h["ifeval/inst_loose"] <= 1.0
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    for name in ("prompt_strict", "prompt_loose", "inst_strict", "inst_loose"):
        assert [e.step for e in events.Scalars(f"ifeval/{name}")] == [0, 1]
    assert "inst_loose" in (out / "run.log").read_text()
