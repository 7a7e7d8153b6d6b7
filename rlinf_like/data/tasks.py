"""Verifiable reasoning tasks: procedurally generated arithmetic, and user datasets in JSONL.

A `Problem` is a prompt and a reference answer. `arithmetic_problems` is deterministic in its
seed, so train and held-out sets are reproducible and disjoint by construction (different seeds,
and held-out items that also occur in train are dropped). `load_jsonl` reads the common
prompt/answer formats: {"prompt", "answer"}, {"question", "answer"} with GSM8K's "#### 42"
final-answer convention, or a chat-style {"messages": [...]} whose last assistant turn is the answer.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    solution: str = ""  # a worked solution, for SFT warm-start; empty when the dataset has none


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


_GSM8K_FINAL = re.compile(r"####\s*(.+)$", re.MULTILINE)


def load_jsonl(path: str | Path) -> list[Problem]:
    problems = []
    for line_no, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "messages" in row:
            turns = row["messages"]
            prompt = "\n".join(m["content"] for m in turns if m["role"] != "assistant")
            answer_text = next((m["content"] for m in reversed(turns) if m["role"] == "assistant"), None)
        else:
            prompt = row.get("prompt", row.get("question"))
            answer_text = row.get("answer")
        if prompt is None or answer_text is None:
            raise ValueError(f"{path}:{line_no}: needs 'prompt' or 'question' and 'answer' (or 'messages'); "
                             f"has {sorted(row)}")
        final = _GSM8K_FINAL.search(str(answer_text))
        answer = final.group(1).strip() if final else str(answer_text).strip()
        problems.append(Problem(prompt=str(prompt), answer=answer, solution=str(answer_text)))
    return problems
