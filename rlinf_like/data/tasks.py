"""Verifiable reasoning problems, and the built-in generator of arithmetic ones.

A `Problem` is a prompt and a reference answer (plus a worked solution for SFT, and the data row's
columns). `arithmetic_problems` is deterministic in its seed, so train and held-out sets are
reproducible and disjoint by construction (different seeds, and held-out items that also occur in
train are dropped). User data is read by the sources in `data/sources/`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    solution: str = ""  # a worked solution, for SFT warm-start; empty when the dataset has none
    messages: tuple[dict, ...] = ()  # chat-style data: the conversation before the answer (prompt is its last user turn)
    # the data row's other columns: `data.prompt_template` placeholders, and `**info` for the reward function
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ArithmeticSpec:
    terms: int = 2  # numbers per expression
    max_operand: int = 9
    operators: str = "+-"


def worked_solution(numbers: list[int], ops: list[str]) -> str:
    """Left-to-right steps for +/- chains ("3+5=8, 8-2=6. Answer: 6"); just the answer otherwise
    or for a single operation. The steps are what makes multi-term problems learnable by a small
    model: each step is one small fact, and the composition generalises."""
    if len(ops) < 2 or any(op not in "+-" for op in ops):
        value = eval(str(numbers[0]) + "".join(op + str(x) for op, x in zip(ops, numbers[1:])), {"__builtins__": {}})
        return f"Answer: {value}"
    steps, value = [], numbers[0]
    for op, x in zip(ops, numbers[1:]):
        new = value + x if op == "+" else value - x
        steps.append(f"{value}{op}{x}={new}")
        value = new
    return ", ".join(steps) + f". Answer: {value}"


def arithmetic_problems(n: int, seed: int, spec: ArithmeticSpec = ArithmeticSpec()) -> list[Problem]:
    """`n` problems like "3+5-2=" with their value and a worked solution (`worked_solution`)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        numbers = [rng.randint(0, spec.max_operand) for _ in range(spec.terms)]
        ops = [rng.choice(spec.operators) for _ in range(spec.terms - 1)]
        expression = str(numbers[0]) + "".join(op + str(x) for op, x in zip(ops, numbers[1:]))
        value = eval(expression, {"__builtins__": {}})  # digits and + - * only, built above
        out.append(Problem(prompt=f"{expression}=", answer=str(value), solution=worked_solution(numbers, ops)))
    return out


def split_train_test(n_train: int, n_test: int, seed: int, spec: ArithmeticSpec = ArithmeticSpec()):
    """Disjoint train / held-out sets (held-out prompts never appear in train)."""
    train = arithmetic_problems(n_train, seed, spec)
    seen = {p.prompt for p in train}
    test = [p for p in arithmetic_problems(n_test * 4, seed + 1_000_003, spec) if p.prompt not in seen][:n_test]
    if len(test) < n_test:
        raise ValueError(f"only {len(test)} held-out problems are not in train; widen the task or shrink the sets")
    return train, test
