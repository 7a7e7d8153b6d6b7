"""`data.source=files`: the user's own data, read with the `datasets` library from local parquet,
JSONL / JSON or CSV files, or a `save_to_disk` folder, with the columns `data.prompt_key`,
`data.answer_key` and optionally `data.solution_key`.

Answer conventions: a GSM8K answer ("...\\n#### 42") and a MATH solution ("... \\boxed{3/4}") are reduced
to their final answer ("42", "3/4") and kept whole as the SFT warm-start text. A prompt column of chat
messages ([{"role", "content"}, ...]) is kept as a conversation; a trailing assistant turn is dropped
from it and, when the row has no answer column, is the answer. Every row is checked here, before any
worker starts: a missing key names the file, the row and the key.
"""

from __future__ import annotations

import logging
import math
import random
import re
from pathlib import Path
from typing import Any

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.data.tasks import Problem

log = logging.getLogger(__name__)

BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}  # suffix -> datasets builder
_GSM8K_FINAL = re.compile(r"####\s*([^\n]*?)\s*$")  # GSM8K answers end with "#### 42" (a bare "####": empty)


class FileSource(DataSource):
    keys = ("train_files", "test_files", "test_fraction", "prompt_key", "answer_key", "solution_key")
    default_reward = "math"

    @classmethod
    def load(cls, cfg) -> Tasks:
        if not cfg.train_files:
            raise ValueError("data.source=files needs data.train_files, e.g. data.train_files=[train.parquet]")
        train = [p for path in cfg.train_files for p in read_problems(path, cfg, split="train")]
        if cfg.test_files:
            test = [p for path in cfg.test_files for p in read_problems(path, cfg, split="test")]
        elif cfg.test_fraction > 0:
            train, test = split_off(train, cfg.test_fraction, cfg.seed)
        else:
            raise ValueError("data.source=files needs data.test_files or data.test_fraction > 0 (the held-out set "
                             "that runner.eval_every evaluates)")
        report_overlap(train, test)
        return Tasks(sft=train, test=test, pool=train, epochs=True)


def split_off(rows: list[Problem], fraction: float, seed: int) -> tuple[list[Problem], list[Problem]]:
    """A seeded `fraction` of `rows` held out (at least one row, and at least one left to train on)."""
    if len(rows) < 2:
        raise ValueError(f"data.test_fraction={fraction} needs at least 2 rows in data.train_files, got {len(rows)}")
    order = random.Random(seed).sample(range(len(rows)), len(rows))
    n_test = min(max(1, round(fraction * len(rows))), len(rows) - 1)
    held = set(order[:n_test])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


def report_overlap(train: list[Problem], test: list[Problem]) -> None:
    seen = {p.prompt for p in train}
    shared = [p.prompt for p in test if p.prompt in seen]
    if shared:
        log.warning("%d of %d held-out prompts also occur in the training data (e.g. %r): held-out accuracy will "
                    "overstate generalisation", len(shared), len(test), shared[0][:80])


def open_dataset(path: str, split: str):
    """The rows of one file or `save_to_disk` folder, as a `datasets.Dataset`."""
    import datasets

    p = Path(path)
    if not p.exists():
        raise ValueError(f"data.{split}_files: the data file {path!r} does not exist")
    if p.is_dir():
        try:
            ds = datasets.load_from_disk(str(p))
        except FileNotFoundError as e:
            raise ValueError(f"{path}: a folder that is not a save_to_disk dataset ({e}); data.source=files reads "
                             f"{sorted(BUILDERS)} files and save_to_disk folders") from e
        if isinstance(ds, datasets.DatasetDict):
            if split not in ds:
                raise ValueError(f"{path}: a DatasetDict without a {split!r} split (it has {sorted(ds)})")
            ds = ds[split]
        return ds
    builder = BUILDERS.get(p.suffix.lower())
    if builder is None:
        raise ValueError(f"{path}: unknown file type {p.suffix!r}; data.source=files reads {sorted(BUILDERS)} "
                         f"files and save_to_disk folders")
    if p.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty")
    try:
        return datasets.load_dataset(builder, data_files=str(p), split="train")
    except Exception as e:  # datasets' own errors name neither the file nor the row
        raise ValueError(f"{path}: cannot be read as {builder} data ({type(e).__name__}: {e})") from e


def read_problems(path: str, cfg, split: str) -> list[Problem]:
    ds = open_dataset(path, split)
    if len(ds) == 0:
        raise ValueError(f"{path}: the dataset is empty")
    columns = ds.column_names
    for key in ("prompt_key", "solution_key"):
        column = getattr(cfg, key)
        if column and column not in columns:
            raise ValueError(f"{path}: data.{key}={column!r} is not a column (columns: {columns})")
    answer_key = cfg.answer_key if cfg.answer_key in columns else ""
    if cfg.answer_key and not answer_key and not isinstance(ds[0][cfg.prompt_key], list):
        raise ValueError(f"{path}: data.answer_key={cfg.answer_key!r} is not a column (columns: {columns})")
    return [to_problem(row, f"{path} row {i}", cfg.prompt_key, answer_key, cfg.solution_key)
            for i, row in enumerate(ds)]


def to_problem(row: dict[str, Any], where: str, prompt_key: str, answer_key: str, solution_key: str) -> Problem:
    """One row as a Problem; `where` ("train.jsonl row 3") names it in errors."""
    raw = _present(row[prompt_key])
    messages: tuple[dict, ...] = ()
    last_assistant = None
    if isinstance(raw, list):
        messages = tuple(dict(role=m["role"], content=m["content"]) for m in raw)
        if messages and messages[-1]["role"] == "assistant":
            last_assistant, messages = messages[-1]["content"], messages[:-1]
        if not messages or messages[-1]["role"] != "user":
            raise ValueError(f"{where}: data.prompt_key={prompt_key!r} holds messages that do not end with a user "
                             f"turn (before any final assistant turn)")
        prompt = messages[-1]["content"]
    else:
        prompt = raw
    if prompt is None or str(prompt).strip() == "":
        raise ValueError(f"{where}: data.prompt_key={prompt_key!r} is missing (empty or null)")
    full = _present(row[answer_key]) if answer_key else last_assistant
    if full is None or str(full).strip() == "":
        what = f"data.answer_key={answer_key!r}" if answer_key else "the answer (no answer column, no assistant turn)"
        raise ValueError(f"{where}: {what} is missing (empty or null)")
    answer, solution = final_answer(str(full)), str(full)
    if not answer:
        what = f"data.answer_key={answer_key!r}" if answer_key else "the last assistant turn"
        raise ValueError(f"{where}: {what} has an empty final answer ({solution[-60:]!r})")
    if solution_key:
        if _present(row[solution_key]) is None:
            raise ValueError(f"{where}: data.solution_key={solution_key!r} is missing (null)")
        solution = str(_present(row[solution_key]))
    return Problem(prompt=str(prompt), answer=answer, solution=solution, messages=messages, fields=dict(row))


def _present(value: Any) -> Any:
    """A cell's value: None for a missing one (a NaN in a float column too); a whole float as an int (a JSON
    or CSV column mixing 42 and 2.5 is read as floats, and the answer "42" must not become "42.0")."""
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if value.is_integer():
            return int(value)
    return value


def final_answer(text: str) -> str:
    """GSM8K's "#### 42" -> "42"; a MATH solution's last \\boxed{...} -> its content; anything else unchanged."""
    from rlinf_like.workers.reward.rules import last_boxed

    gsm8k = _GSM8K_FINAL.search(text)
    if gsm8k:
        return gsm8k.group(1).strip()
    boxed = last_boxed(text)
    return boxed if boxed is not None else text.strip()
