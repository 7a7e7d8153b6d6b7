"""The `data` section of the reasoning schema: where problems come from (`data.source`, a name in
`DATA_SOURCES`) and how a prompt is rendered for the model (chat template, system prompt, template).
Each source reads its own keys; the checks refuse another source's key set to a non-default value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlinf_like.config.validate import bounded


@dataclass(kw_only=True)
class DataConfig:
    # a name in DATA_SOURCES (data/sources/): arithmetic (generated) | files (parquet / JSONL / JSON / CSV /
    # save_to_disk folders, read with `datasets`) | reasoning_gym (the reasoning-gym package's generators)
    source: str = "arithmetic"
    seed: int = 0  # seeds generation, the test_fraction split and the epoch order of file data
    # arithmetic and reasoning_gym: the SFT warm-start set; RL draws from 20x as many fresh problems
    sft_problems: int = bounded(600, ge=0)
    test_problems: int = bounded(200, ge=1)  # arithmetic and reasoning_gym: the held-out set's size
    terms: int = bounded(3, ge=1)  # arithmetic: numbers per expression, with worked left-to-right steps
    max_operand: int = bounded(9, ge=1)  # arithmetic: operands are drawn from 0..max_operand
    operators: str = "+-"  # arithmetic: the operators problems draw from
    name: str = ""  # reasoning_gym: the generator, e.g. chain_sum, basic_arithmetic, countdown
    # reasoning_gym: the generator's own settings, e.g. {min_terms: 2, max_digits: 1}; command line: +data.options.x=1
    options: dict[str, Any] = field(default_factory=dict)
    train_files: list[str] = field(default_factory=list)  # files: training data, e.g. [train.parquet]
    test_files: list[str] = field(default_factory=list)  # files: held-out data; empty: use test_fraction
    test_fraction: float = bounded(0.0, ge=0, lt=1)  # files without test_files: this share of train, held out
    prompt_key: str = "prompt"  # files: the prompt column (text, or chat messages [{role, content}, ...])
    # files: the reference answer column; a full GSM8K ("... #### 42") or MATH (\boxed{}) solution is
    # reduced to its final answer and kept as the SFT text. Empty with a messages prompt: the last assistant turn
    answer_key: str = "answer"
    solution_key: str = ""  # files: a worked-solution column for the SFT warm-start; empty: the answer column
    # auto: the tokenizer's own chat template when it has one (raw text otherwise) | none: raw text |
    # a path to a Jinja chat-template file
    chat_template: str = "auto"
    system_prompt: str = ""  # a system message before each prompt (without a template: its own line before it)
    # how a problem becomes the user's message: {prompt} and any of the row's columns by name, e.g.
    # "{question}\nPut the final answer in \\boxed{{}}."
    prompt_template: str = "{prompt}"
