"""Bring your own data (issue 16): the `data.*` sources (files in every format `datasets` reads, reasoning_gym,
arithmetic), the answer conventions (GSM8K's `#### N`, MATH's `\\boxed{}`) on hand-made samples
(tests/data/), the errors a bad file or key gets before any worker starts, the seeded epoch order of file
data, and two 2-step runs on the samples."""

import json
import os
import random
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from rlinf_like.config import ConfigError, check_overrides, structure
from rlinf_like.data.config import DataConfig
from rlinf_like.data.sources import Tasks, check_data_config, load_tasks
from rlinf_like.data.sources.base import epoch_order
from rlinf_like.data.sources.files import final_answer, read_problems, split_off
from rlinf_like.data.tasks import Problem
from rlinf_like.runners.reasoning.checks import check_config
from rlinf_like.runners.reasoning.worker_configs import reward_config
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.phases import make_requests
from rlinf_like.workers.reward.builtin import math_reward, reasoning_gym_reward
from small_runs import in_process, small_reasoning_config

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"
GSM8K, MATH = DATA / "gsm8k_sample.jsonl", DATA / "math_sample.jsonl"

# the final answers of the samples' rows, in file order, as written by hand (not derived from the files)
GSM8K_ANSWERS = ["20", "120", "40", "900", "260", "10", "7,500", "133", "5", "160", "667", "480", "46", "3,235", "13",
                 "26", "325", "30", "41", "100", "18,000", "107", "108", "192", "135", "32", "495", "25", "5", "16,500",
                 "17", "8.75"]
MATH_ANSWERS = ["4", r"\frac{3}{4}", r"\dfrac{1}{2}", r"25\%", r"\{2, 3\}", r"\text{(B)}", r"5\sqrt{2}", r"9\pi", "12",
                "60", "49", "3", "720", "15", "(1, 5)", r"[2, \infty)", "2", "x + 3", "5050", "18", r"\frac{1}{3}",
                "36", "5", "13", "5", "(7, 3)", r"\frac{1}{4}", r"\textbf{(D)}", "6", "42", r"\dfrac{\sqrt{3}}{2}",
                "-3"]


def gsm8k(**overrides) -> DataConfig:
    return DataConfig(**{"source": "files", "train_files": [str(GSM8K)], "prompt_key": "question",
                         "test_fraction": 0.25, **overrides})


def math_data(**overrides) -> DataConfig:
    return DataConfig(**{"source": "files", "train_files": [str(MATH)], "prompt_key": "problem",
                         "answer_key": "solution", "test_fraction": 0.25, **overrides})


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the hand-made samples: the dataset's own solutions score as correct --------------------------------------------

def test_gsm8k_sample_is_consistent():
    """Every calculator annotation <<a=b>> of the sample is right, and the last one is the final answer."""
    rows = rows_of(GSM8K)
    assert len(rows) == len(GSM8K_ANSWERS) >= 30 and all(set(r) == {"question", "answer"} for r in rows)
    for row, final in zip(rows, GSM8K_ANSWERS):
        calls = re.findall(r"<<([^=>]+)=([^>]+)>>", row["answer"])
        assert calls and all(abs(eval(expr) - float(value)) < 1e-9 for expr, value in calls), row
        assert row["answer"].endswith(f"\n#### {final}") and float(calls[-1][1]) == float(final.replace(",", ""))


def test_gsm8k_rows_reduce_to_their_final_answer_and_their_solutions_score_correct():
    problems = read_problems(str(GSM8K), gsm8k(), "train")
    rows = rows_of(GSM8K)
    assert [p.answer for p in problems] == GSM8K_ANSWERS
    assert [(p.prompt, p.solution) for p in problems] == [(r["question"], r["answer"]) for r in rows]
    assert all(p.fields == r for p, r in zip(problems, rows))  # the row's columns travel with the problem
    for p in problems:
        assert math_reward(p.solution, p.answer)["correct"], p.solution  # "#### 7,500" against "7,500"
        number = float(p.answer.replace(",", ""))
        assert math_reward(f"#### {number:g}", p.answer)["correct"]  # 7500 = 7,500
        assert not math_reward(f"#### {number + 1:g}", p.answer)["correct"]


def test_math_rows_reduce_to_their_boxed_answer_and_their_solutions_score_correct():
    problems = read_problems(str(MATH), math_data(), "train")
    rows = rows_of(MATH)
    assert len(rows) >= 30 and all(set(r) == {"problem", "solution", "level", "type"} for r in rows)
    assert [p.answer for p in problems] == MATH_ANSWERS
    assert [(p.prompt, p.solution) for p in problems] == [(r["problem"], r["solution"]) for r in rows]
    assert problems[0].fields["level"] == "Level 1" and problems[0].fields["type"] == "Algebra"
    assert all(math_reward(p.solution, p.answer)["correct"] for p in problems)


# the same answer written another way, scored against the reference the MATH sample's row reduces to
EQUIVALENT_FORMS = {1: "0.75", 2: "1/2", 3: "0.25", 4: r"\{3,2\}", 5: "B", 6: r"\sqrt{50}", 17: "3+x",
                    20: "1/3", 25: "(7,3)", 27: "(D)", 30: r"\frac{\sqrt3}{2}"}
WRONG_FORMS = {1: "0.7", 2: "1/3", 3: "0.2", 4: r"\{2,4\}", 5: "C", 6: r"\sqrt{5}", 17: "x-3", 20: "3",
               25: "(3,7)", 27: "(A)", 30: r"\frac{1}{2}"}


@pytest.mark.parametrize("row", sorted(EQUIVALENT_FORMS))
def test_math_reward_accepts_other_forms_of_the_sample_answers(row):
    p = read_problems(str(MATH), math_data(), "train")[row]
    assert math_reward(f"so \\boxed{{{EQUIVALENT_FORMS[row]}}}", p.answer)["correct"]
    assert not math_reward(f"so \\boxed{{{WRONG_FORMS[row]}}}", p.answer)["correct"]


@pytest.mark.parametrize("text,answer", [
    ("so 6*7=42\n#### 42", "42"), ("#### 1,234\n", "1,234"), ("#### 8.75  \n\n", "8.75"),
    ("x = \\boxed{\\{1, 2\\}}.", "\\{1, 2\\}"),
    ("\\boxed{1} then \\boxed{\\dfrac{3}{4}}", "\\dfrac{3}{4}"), (" 17 ", "17"), ("#### Steps\nthen \\boxed{5}", "5"),
    ("no answer here", "no answer here"), ("so ####", ""), ("\\boxed{}", ""),
])
def test_final_answer(text, answer):
    assert final_answer(text) == answer


# --- data.source=files in each format -------------------------------------------------------------------------------

def test_jsonl_with_test_fraction_is_a_seeded_disjoint_split():
    a, b = load_tasks(gsm8k()), load_tasks(gsm8k())
    assert a == b  # deterministic
    assert a.epochs and a.sft == a.pool  # a dataset: walked in epochs, the SFT set is the training rows
    assert len(a.test) == 8 and len(a.pool) == 24  # round(0.25 * 32)
    assert not {p.prompt for p in a.test} & {p.prompt for p in a.pool}
    assert sorted(p.prompt for p in a.test + a.pool) == sorted(r["question"] for r in rows_of(GSM8K))
    other = load_tasks(gsm8k(seed=1))
    assert {p.prompt for p in other.test} != {p.prompt for p in a.test}  # the seed picks the held-out rows
    rows = [p.prompt for p in read_problems(str(GSM8K), gsm8k(), "train")]
    assert [p.prompt for p in a.pool] == [r for r in rows if r in {p.prompt for p in a.pool}]  # file order kept


def test_split_off_keeps_a_row_on_each_side():
    rows = [Problem(prompt=str(i), answer=str(i)) for i in range(2)]
    assert [len(part) for part in split_off(rows, 0.01, 0)] == [1, 1]
    assert [len(part) for part in split_off(rows, 0.99, 0)] == [1, 1]
    with pytest.raises(ValueError, match=r"data.test_fraction=0.5 needs at least 2 rows in data.train_files, got 1"):
        split_off(rows[:1], 0.5, 0)


def test_parquet_with_custom_columns_and_a_solution_column(tmp_path):
    import datasets

    train = datasets.Dataset.from_dict({
        "query": ["2+3?", "10/4?", "Half of 9?"],
        "target": ["2+3=5\n#### 5", "so \\boxed{\\frac{5}{2}}", "4.5"],
        "worked": ["Two and three make five. Answer: 5", "Divide: 5/2. Answer: 5/2", "9/2. Answer: 4.5"],
        "difficulty": [1, 2, 3]})
    train.to_parquet(str(tmp_path / "train.parquet"))
    train.select([2]).to_parquet(str(tmp_path / "test.parquet"))
    cfg = DataConfig(source="files", train_files=[str(tmp_path / "train.parquet")],
                     test_files=[str(tmp_path / "test.parquet")], prompt_key="query", answer_key="target",
                     solution_key="worked")
    check_data_config(cfg)
    tasks = load_tasks(cfg)
    assert [(p.prompt, p.answer) for p in tasks.pool] == [("2+3?", "5"), ("10/4?", "\\frac{5}{2}"),
                                                          ("Half of 9?", "4.5")]
    assert [p.solution for p in tasks.sft] == train["worked"]  # the SFT text is the solution column
    assert [p.fields["difficulty"] for p in tasks.pool] == [1, 2, 3]
    assert [p.prompt for p in tasks.test] == ["Half of 9?"]
    with pytest.raises(ValueError, match=r"train.parquet: data.prompt_key='question' is not a column \(columns: "
                                         r"\['query', 'target', 'worked', 'difficulty'\]\)"):
        load_tasks(replace(cfg, prompt_key="question"))


def test_csv_with_numeric_answers(tmp_path):
    """A CSV column mixing 42 and 2.5 is read as floats; a whole number stays "42", not "42.0"."""
    (tmp_path / "train.csv").write_text('prompt,answer\n"6*7",42\n"5/2",2.5\n"3,000 + 1",3001\n')
    problems = read_problems(str(tmp_path / "train.csv"), DataConfig(), "train")
    assert [(p.prompt, p.answer, p.solution) for p in problems] == [
        ("6*7", "42", "42"), ("5/2", "2.5", "2.5"), ("3,000 + 1", "3001", "3001")]
    write_jsonl(tmp_path / "mixed.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2.5}])
    assert [p.answer for p in read_problems(str(tmp_path / "mixed.jsonl"), DataConfig(), "train")] == ["1", "2.5"]


def test_save_to_disk_folders(tmp_path, caplog):
    """A `Dataset` folder, and a `DatasetDict` folder whose train split trains and whose test split is held out."""
    import datasets

    rows = rows_of(GSM8K)
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "single"))
    tasks = load_tasks(gsm8k(train_files=[str(tmp_path / "single")]))
    assert tasks == load_tasks(gsm8k())  # the same rows as the JSONL file, the same split

    datasets.DatasetDict(train=ds.select(range(24)), test=ds.select(range(24, 32))).save_to_disk(str(tmp_path / "dd"))
    with caplog.at_level("WARNING"):
        tasks = load_tasks(gsm8k(train_files=[str(tmp_path / "dd")], test_files=[str(tmp_path / "dd")],
                                 test_fraction=0.0))
    assert [p.prompt for p in tasks.pool] == [r["question"] for r in rows[:24]]
    assert [p.prompt for p in tasks.test] == [r["question"] for r in rows[24:]]
    assert [p.answer for p in tasks.test] == GSM8K_ANSWERS[24:]
    assert not caplog.records  # disjoint: no overlap warning

    datasets.DatasetDict(train=ds).save_to_disk(str(tmp_path / "train_only"))
    with pytest.raises(ValueError, match=r"train_only: a DatasetDict without a 'test' split \(it has \['train'\]\)"):
        load_tasks(gsm8k(test_files=[str(tmp_path / "train_only")]))
    (tmp_path / "not_a_dataset").mkdir()
    ds.to_parquet(str(tmp_path / "not_a_dataset" / "part.parquet"))
    with pytest.raises(ValueError, match=r"not_a_dataset: a folder that is not a save_to_disk dataset"):
        load_tasks(gsm8k(train_files=[str(tmp_path / "not_a_dataset")]))


def test_chat_messages_in_parquet(tmp_path):
    import datasets

    conversation = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 6*7?"},
                    {"role": "assistant", "content": "6*7 = \\boxed{42}"}]
    chat = datasets.Dataset.from_list([{"messages": conversation, "source": "hand"}])
    chat.to_parquet(str(tmp_path / "chat.parquet"))
    [p] = read_problems(str(tmp_path / "chat.parquet"), DataConfig(prompt_key="messages"), "train")
    assert (p.prompt, p.answer, p.solution, p.messages) == ("What is 6*7?", "42", "6*7 = \\boxed{42}",
                                                            tuple(conversation[:2]))


# --- data.source=reasoning_gym --------------------------------------------------------------------------------------

def test_reasoning_gym_source():
    cfg = DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=8, test_problems=5)
    check_data_config(cfg)
    tasks = load_tasks(cfg)
    assert (len(tasks.sft), len(tasks.test), tasks.epochs) == (8, 5, False)
    assert 0 < len(tasks.pool) <= 20 * 8
    held_out = {p.prompt for p in tasks.test}
    assert not held_out & {p.prompt for p in tasks.sft} and not held_out & {p.prompt for p in tasks.pool}
    for p in tasks.sft + tasks.test + tasks.pool:
        assert p.fields["metadata"]["source_dataset"] == "chain_sum"
        assert p.solution == f"\\boxed{{{p.answer}}}"  # what both the math and the reasoning_gym rewards read
        assert math_reward(p.solution, p.answer)["correct"]
        assert reasoning_gym_reward(p.solution, p.answer, **p.fields)["correct"]
    assert load_tasks(cfg) == tasks and load_tasks(replace(cfg, seed=1)) != tasks
    assert reward_config(ReasoningConfig(data=cfg)).fn == "reasoning_gym"  # what reward.fn=auto means here
    assert reward_config(ReasoningConfig(data=gsm8k())).fn == "math"
    assert reward_config(ReasoningConfig()).fn == "math"


def test_reasoning_gym_options_reach_the_generator():
    """data.options is the generator's own config: two one-digit terms give sums of two digits 0-9."""
    cfg = DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=8, test_problems=4,
                     options={"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1})
    tasks = load_tasks(cfg)
    for p in tasks.sft + tasks.test:
        assert p.fields["metadata"]["num_terms"] == 2 and re.fullmatch(r".*: \d [+-] \d =", p.prompt), p.prompt
    with pytest.raises(ValueError, match=r"data.options=\{'max_termz': 2\} do not fit data.name=chain_sum"):
        load_tasks(replace(cfg, options={"max_termz": 2}))


def test_reasoning_gym_held_out_problems_are_kept_out_of_the_other_sets(monkeypatch):
    """A generator whose every seed gives the same stream (0, 1, 2, ...): held-out problems are the first ones not
    in the SFT set, and the RL pool leaves them out."""
    from rlinf_like.data.sources import reasoning_gym

    monkeypatch.setattr(reasoning_gym, "problems", lambda name, size, seed, options=None: [
        Problem(prompt=str(i), answer=str(i), fields={"metadata": {"source_dataset": name}}) for i in range(size)])
    tasks = load_tasks(DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=8, test_problems=3))
    assert [p.prompt for p in tasks.sft] == [str(i) for i in range(8)]
    assert [p.prompt for p in tasks.test] == ["8", "9", "10"]
    assert [p.prompt for p in tasks.pool] == [str(i) for i in range(160) if i not in (8, 9, 10)]


def test_reasoning_gym_too_few_held_out_problems_is_named(monkeypatch):
    from rlinf_like.data.sources import reasoning_gym

    same = reasoning_gym.problems("chain_sum", 8, 0)
    monkeypatch.setattr(reasoning_gym, "problems", lambda name, size, seed, options=None: same[:size])  # every seed: the same
    with pytest.raises(ValueError, match=r"data.name=chain_sum gives only 0 held-out problems"):
        load_tasks(DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=8, test_problems=2))


def test_reasoning_gym_reward():
    [p] = load_tasks(DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=2, test_problems=1)).test
    right = reasoning_gym_reward(f"I add them up. <answer>{p.answer}</answer>", p.answer, prompt=p.prompt, **p.fields)
    assert right == {"reward": 1.0, "correct": True, "formatted": True, "reasoning_gym_score": 1.0}
    wrong = reasoning_gym_reward(f"<answer>{int(p.answer) + 1}</answer>", p.answer, prompt=p.prompt, **p.fields)
    assert (wrong["correct"], wrong["reasoning_gym_score"]) == (False, 0.0)
    last = reasoning_gym_reward(f"<answer>{int(p.answer) + 1}</answer> no: <answer>{p.answer}</answer>", p.answer,
                                prompt=p.prompt, **p.fields)
    assert last["correct"]  # the last tagged answer counts
    with pytest.raises(ValueError, match=r"reward.fn=reasoning_gym needs data.source=reasoning_gym \(the row has no "
                                         r"metadata.source_dataset\)"):
        reasoning_gym_reward(f"<answer>{p.answer}</answer>", p.answer, prompt=p.prompt)


# --- errors, before any worker starts, naming the file, the row and the key -----------------------------------------

def bad_rows(tmp_path, rows, name="bad.jsonl", **cfg):
    path = write_jsonl(tmp_path / name, rows)
    with pytest.raises(ValueError) as err:
        load_tasks(DataConfig(source="files", train_files=[str(path)], test_fraction=0.5, **cfg))
    return str(err.value).replace(str(tmp_path) + os.sep, "")


GOOD = {"question": "1+1?", "answer": "#### 2", "hint": "add"}


@pytest.mark.parametrize("bad,message", [
    ({"question": "2+2?", "answer": None}, "bad.jsonl row 2: data.answer_key='answer' is missing (empty or null)"),
    ({"question": "2+2?", "answer": "  "}, "bad.jsonl row 2: data.answer_key='answer' is missing (empty or null)"),
    ({"question": "2+2?"}, "bad.jsonl row 2: data.answer_key='answer' is missing (empty or null)"),
    ({"question": None, "answer": "4"}, "bad.jsonl row 2: data.prompt_key='question' is missing (empty or null)"),
    ({"question": "", "answer": "4"}, "bad.jsonl row 2: data.prompt_key='question' is missing (empty or null)"),
    ({"question": "2+2?", "answer": "so ####"}, "bad.jsonl row 2: data.answer_key='answer' has an empty final answer"),
    ({"question": "2+2?", "answer": "\\boxed{ }"},
     "bad.jsonl row 2: data.answer_key='answer' has an empty final answer"),
])
def test_a_missing_value_names_the_file_row_and_key(tmp_path, bad, message):
    assert bad_rows(tmp_path, [GOOD, GOOD, bad, GOOD], prompt_key="question").startswith(message)


@pytest.mark.parametrize("keys,message", [
    ({"prompt_key": "query"},
     "bad.jsonl: data.prompt_key='query' is not a column (columns: ['question', 'answer', 'hint'])"),
    ({"prompt_key": "question", "answer_key": "solution"},
     "bad.jsonl: data.answer_key='solution' is not a column (columns: ['question', 'answer', 'hint'])"),
    ({"prompt_key": "question", "solution_key": "steps"},
     "bad.jsonl: data.solution_key='steps' is not a column (columns: ['question', 'answer', 'hint'])"),
])
def test_a_key_that_is_not_a_column_is_named(tmp_path, keys, message):
    assert bad_rows(tmp_path, [GOOD, GOOD], **keys) == message


@pytest.mark.parametrize("name,content,message", [
    ("empty.jsonl", "", "empty.jsonl: the file is empty"),
    ("header.csv", "prompt,answer\n", "header.csv: cannot be read as csv data"),
    ("list.json", "[]", "list.json: cannot be read as json data"),
    ("broken.jsonl", '{"prompt": "1+1", "answer": "2"}\n{"prompt": \n', "broken.jsonl: cannot be read as json data"),
    ("data.txt", "1+1=2\n", "data.txt: unknown file type '.txt'; data.source=files reads ['.csv', '.json', '.jsonl', "
                            "'.parquet'] files and save_to_disk folders"),
])
def test_an_unreadable_file_is_named(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as err:
        load_tasks(DataConfig(source="files", train_files=[str(tmp_path / name)], test_fraction=0.5))
    assert str(err.value).replace(str(tmp_path) + os.sep, "").startswith(message)


def test_a_missing_file_and_missing_sets_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"^data.train_files: the data file '.*nowhere.jsonl' does not exist"):
        load_tasks(gsm8k(train_files=[str(tmp_path / "nowhere.jsonl")]))
    with pytest.raises(ValueError, match=r"^data.test_files: the data file '.*nowhere.parquet' does not exist"):
        load_tasks(gsm8k(test_files=[str(tmp_path / "nowhere.parquet")], test_fraction=0.0))
    with pytest.raises(ValueError, match=r"data.source=files needs data.train_files"):
        load_tasks(DataConfig(source="files", test_fraction=0.5))
    with pytest.raises(ValueError, match=r"data.source=files needs data.test_files or data.test_fraction > 0"):
        load_tasks(gsm8k(test_fraction=0.0))
    with pytest.raises(ValueError, match=r"data.source=arithmetic gives RL steps no problems to draw from "
                                         r"\(data.sft_problems=0, "):
        load_tasks(DataConfig(sft_problems=0))  # the RL pool is 20 x data.sft_problems fresh problems


@pytest.mark.parametrize("cfg,message", [
    (DataConfig(source="file"),
     r"data.source='file' is not one of \['arithmetic', 'files', 'ifeval_train', 'reasoning_gym', 'verifiers'\]"),
    (DataConfig(train_files=["train.parquet"]),
     r"data.train_files=\['train.parquet'\] is read by data.source=files; data.source=arithmetic does not read it"),
    (DataConfig(source="files", train_files=["t.jsonl"], test_fraction=0.1, terms=4),
     r"data.terms=4 is read by data.source=arithmetic; data.source=files does not read it"),
    (DataConfig(source="reasoning_gym", name="chain_sum", prompt_key="question"),
     r"data.prompt_key='question' is read by data.source=files; data.source=reasoning_gym does not read it"),
    (DataConfig(chat_template="templates/missing.jinja"),
     r"data.chat_template='templates/missing.jinja' must be auto, none or a Jinja template file that exists"),
])
def test_data_keys_are_checked_with_the_config(tmp_path, cfg, message):
    with pytest.raises(ValueError, match=message):
        check_data_config(cfg)
    full = ReasoningConfig(data=cfg)
    full.runner.output_dir = str(tmp_path)
    with pytest.raises(ValueError, match=message):
        check_config(full)


def test_an_unknown_reasoning_gym_generator_is_named():
    with pytest.raises(ValueError, match=r"data.name='chain_summ' is not a reasoning_gym generator; choose one of "
                                         r"\[.*'chain_sum'.*\]"):
        load_tasks(DataConfig(source="reasoning_gym", name="chain_summ"))


def test_held_out_rows_that_are_also_trained_on_are_a_warning(tmp_path, caplog):
    rows = rows_of(GSM8K)
    test = write_jsonl(tmp_path / "test.jsonl", [rows[3], {"question": "A new one?", "answer": "#### 1"}, rows[7]])
    with caplog.at_level("WARNING", logger="rlinf_like.data.sources.files"):
        tasks = load_tasks(gsm8k(test_files=[str(test)], test_fraction=0.0))
    assert len(tasks.test) == 3 and len(tasks.pool) == 32
    [record] = caplog.records
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith(f"2 of 3 held-out prompts also occur in the training data (e.g. "
                                          f"{rows[3]['question'][:80]!r})")


def test_data_errors_stop_the_run_before_any_worker_starts(tmp_path, monkeypatch):
    """`train` reads the data before it starts the cluster: a bad row fails there, naming the file and row."""
    from rlinf_like.runners.reasoning import run
    from rlinf_like.runners.reasoning import train

    def no_cluster(*args, **kwargs):
        raise AssertionError("the cluster was started")

    monkeypatch.setattr(run, "Cluster", no_cluster)
    monkeypatch.setattr(run, "launch_workers", no_cluster)
    path = write_jsonl(tmp_path / "train.jsonl", [GOOD, GOOD, {"question": "3?", "answer": None}])
    cfg = ReasoningConfig(data=gsm8k(train_files=[str(path)]))
    cfg.runner.output_dir = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"train.jsonl row 2: data.answer_key='answer' is missing"):
        train(cfg)
    cfg = ReasoningConfig(data=DataConfig(source="reasoning_gym", name="chain_sum", sft_problems=0, test_problems=2))
    cfg.runner.output_dir = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"runner.sft_steps=300 needs SFT problems; data.source=reasoning_gym gives "
                                         r"none"):
        train(cfg)
    assert not (tmp_path / "out" / "init_model").exists()


# --- the old task.* keys --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("old,new", [
    ("task.sft_problems", "data.sft_problems"), ("task.seed", "data.seed"), ("task.operators", "data.operators"),
    ("task.kind", "data.source (arithmetic | files | reasoning_gym)"), ("task.train_path", "data.train_files (a list)"),
    ("task.test_path", "data.test_files (a list)"), ("task.anything", "data.anything"),
])
def test_old_task_keys_are_refused_with_their_new_name(old, new):
    message = f"config key '{old}' has moved: use {re.escape(new)}"
    with pytest.raises(ConfigError, match=message):
        check_overrides(ReasoningConfig, [f"{old}=8"])
    with pytest.raises(ConfigError, match=message):
        check_overrides(ReasoningConfig, [f"+{old}=8"])
    with pytest.raises(ConfigError, match=message):
        structure(ReasoningConfig, {"task": {old.split(".")[1]: 8}})


def test_the_old_task_section_is_refused_and_data_keys_are_checked():
    with pytest.raises(ConfigError, match=r"config key 'task' has moved: use data"):
        structure(ReasoningConfig, {"task": {}})
    with pytest.raises(ConfigError, match=r"config key 'task' has moved: use data"):
        check_overrides(ReasoningConfig, ["~task"])
    with pytest.raises(ConfigError, match=r"unknown config key 'data.train_file'.*did you mean 'data.train_files'"):
        check_overrides(ReasoningConfig, ["data.train_file=[a.jsonl]"])
    cfg = structure(ReasoningConfig, {"data": {"source": "files", "train_files": ["a.jsonl"], "test_fraction": 0.1}})
    assert (cfg.data.source, cfg.data.train_files) == ("files", ["a.jsonl"])


def test_main_grpo_refuses_an_old_key_fast():
    # this checkout's code, not whatever an editable install points at
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "reasoning" / "main_grpo.py"),
                             "task.sft_problems=8"], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "config key 'task.sft_problems' has moved: use data.sft_problems" in result.stderr
    assert "placement mode" not in result.stdout + result.stderr  # no cluster was started
    assert elapsed < 20, f"took {elapsed:.1f} s"


# --- the RL steps' data order ---------------------------------------------------------------------------------------

def numbered(n: int, epochs: bool) -> Tasks:
    pool = [Problem(prompt=str(i), answer=str(i)) for i in range(n)]
    return Tasks(sft=pool, test=pool[:1], pool=pool, epochs=epochs)


def drawn(tasks: Tasks, step: int, n: int, seed: int = 5, rng_seed: int = 0) -> list[int]:
    return [int(p.prompt) for p in tasks.draw(step, n, random.Random(rng_seed), seed)]


def test_each_epoch_is_a_permutation_of_the_pool():
    tasks, n, size = numbered(10, epochs=True), 3, 10  # 3 does not divide 10: steps straddle epochs
    sequence = [i for step in range(10) for i in drawn(tasks, step, n)]  # 30 draws: 3 epochs
    epochs = [sequence[k : k + size] for k in range(0, 30, size)]
    assert all(sorted(e) == list(range(size)) for e in epochs)  # every problem exactly once per epoch
    assert len({tuple(e) for e in epochs}) == 3 and epochs[0] != list(range(size))  # reshuffled each epoch
    assert drawn(tasks, 3, n) == [epochs[0][9], epochs[1][0], epochs[1][1]]  # across the boundary
    assert drawn(tasks, 4, n) == epochs[1][2:5]  # mid-epoch
    assert epoch_order(size, range(0, 30), 5) == sequence
    assert [i for step in range(10) for i in drawn(tasks, step, n, seed=6)] != sequence  # data.seed reshuffles


def test_a_draw_is_a_function_of_the_step_alone():
    fresh = drawn(numbered(10, True), 7, 4)
    walked = numbered(10, True)
    for step in range(7):
        drawn(walked, step, 4, rng_seed=step)
    assert drawn(walked, 7, 4, rng_seed=99) == fresh  # step 7 after steps 0..6, whatever the rng
    assert drawn(numbered(10, True), 7, 4, rng_seed=1) == fresh


def test_file_data_is_drawn_in_epochs_by_the_runner(tmp_path):
    cfg = ReasoningConfig(data=gsm8k())
    cfg.runner.prompts_per_step = 5  # 24 training rows: steps straddle epochs

    def prompts(tasks, step):
        requests, problems = make_requests(cfg, tasks, step, lambda p: [ord(c) for c in p.prompt])
        return [r.prompt_ids for r in requests], [p.prompt for p in problems]

    tasks = load_tasks(cfg.data)
    walked = [prompts(tasks, step) for step in range(10)]
    assert prompts(load_tasks(cfg.data), 7) == walked[7]  # what a resumed run draws at step 7
    order = [p for _, problems in walked for p in problems]
    pool = sorted(p.prompt for p in tasks.pool)
    assert sorted(order[:24]) == pool and sorted(order[24:48]) == pool  # each training row once per epoch


def test_generated_data_keeps_its_draws_with_replacement():
    """epochs=False (arithmetic, reasoning_gym): each step draws with `rng.choice`, exactly as before data.* existed;
    the sampling seeds come from the same rng after the draw."""
    cfg = ReasoningConfig()
    cfg.data.sft_problems, cfg.data.test_problems, cfg.runner.seed = 50, 10, 3
    tasks = load_tasks(cfg.data)
    assert not tasks.epochs
    for step in (0, 5):
        requests, problems = make_requests(cfg, tasks, step, lambda p: [ord(c) for c in p.prompt])
        rng = random.Random(3 * 1_000_003 + step)
        assert problems == [rng.choice(tasks.pool) for _ in range(cfg.runner.prompts_per_step)]
        assert [r.sampling.seed for r in requests] == [rng.getrandbits(31) for _ in problems]
    small = numbered(3, epochs=False)
    rng = random.Random(4)
    assert drawn(small, 0, 10, rng_seed=4) == [int(rng.choice(small.pool).prompt) for _ in range(10)]
    assert len(set(drawn(small, 0, 10))) <= 3  # 10 draws from 3: repeats (with replacement)


# --- 2-step runs on the samples -------------------------------------------------------------------------------------

def tiny_run(out: Path, data: DataConfig, reward_fn: str = "auto") -> ReasoningConfig:
    cfg = in_process(small_reasoning_config(out, samples_per_prompt=2))
    cfg.data = data
    m = cfg.model
    m.hidden_size, m.intermediate_size, m.num_heads, m.num_kv_heads = 32, 64, 2, 1
    cfg.runner.sft_steps, cfg.runner.sft_batch_size = 2, 4
    cfg.reward.fn = reward_fn
    return cfg


def gsm8k_run(out: Path) -> ReasoningConfig:
    return tiny_run(out, gsm8k(test_fraction=0.125, prompt_template="Q: {question}\nA:"),
                    reward_fn="user_rewards:gsm8k_row")


def math_run(out: Path) -> ReasoningConfig:
    """The MATH sample through a Jinja chat-template file and a prompt template naming a column."""
    template = out.parent / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}assistant: {% endif %}")
    return tiny_run(out, math_data(test_fraction=0.125, chat_template=str(template),
                                   prompt_template="{prompt} ({type})"))


def run_both(tmp: Path) -> dict[str, list[dict]]:
    """The two runs, one after the other, in process."""
    from rlinf_like.runners.reasoning import train

    return {name: train(make(tmp / name)).history for name, make in (("gsm8k", gsm8k_run), ("math", math_run))}


@pytest.fixture(scope="module")
def histories(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    for name in ("gsm8k", "math"):
        (tmp / name).mkdir()
    return tmp, run_both(tmp)


@pytest.mark.timeout(700)
def test_two_steps_on_the_gsm8k_sample_with_a_user_reward(histories):
    tmp, runs = histories
    history, cfg = runs["gsm8k"], gsm8k_run(tmp / "gsm8k")
    assert [h["step"] for h in history] == [0, 1, 2]
    assert 0.0 <= history[0]["eval_accuracy"] <= 1.0 and "eval_accuracy" in history[2]
    tasks = load_tasks(cfg.data)
    for h in history[1:]:
        _, problems = make_requests(cfg, tasks, h["step"] - 1, lambda p: [0])
        # the reward function got each sample's row: its question column, and the reduced answer
        assert h["reward/question_chars"] == pytest.approx(sum(len(p.fields["question"]) for p in problems) / 4)
        # and the prompt the model saw: data.prompt_template around the question (the char tokenizer round-trips)
        assert h["reward/prompt_chars"] == pytest.approx(h["reward/question_chars"] + len("Q: \nA:"))
        assert h["reward/reference_is_number"] == 1.0
        assert 0.0 <= h["reward"] <= 1.0
    assert (tmp / "gsm8k" / "final_model" / "config.json").exists()


@pytest.mark.timeout(700)
def test_two_steps_on_the_math_sample_with_the_math_reward(histories):
    tmp, runs = histories
    history = runs["math"]
    assert [h["step"] for h in history] == [0, 1, 2]
    assert all(-0.01 <= h["reward"] <= 1.0 for h in history[1:])
    assert not any(k.startswith("reward/") for h in history for k in h)  # the built-in returns no extras
    # the prompts the run rendered: the template file around data.prompt_template, the SFT target after it
    from rlinf_like.data.prompts import PromptFormat
    from rlinf_like.models import load_tokenizer

    cfg = math_run(tmp / "math")
    tokenizer = load_tokenizer(str(tmp / "math" / "init_model"))
    prompts, p = PromptFormat(tokenizer, cfg.data), load_tasks(cfg.data).test[0]
    assert prompts.text(p) == f"user: {p.prompt} ({p.fields['type']})\nassistant: "
    _, target = prompts.sft_ids(p)  # EOS in place of the template's end of turn (a newline)
    assert target == tokenizer(p.solution, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
    assert (tmp / "math" / "final_model" / "config.json").exists()
