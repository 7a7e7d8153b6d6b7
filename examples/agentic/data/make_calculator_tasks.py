"""Writes the calculator preset's tasks: 3-digit x 2-digit products, which the tiny model cannot work out in
its head but can get right by calling the calculator tool and copying its result.

    python examples/agentic/data/make_calculator_tasks.py

Each row: `prompt` ("What is 347*28?"), `answer` ("9716") and `demo`, the assistant's side of a worked
episode for the SFT warm-start (a calculator call, then the answer); the tool's reply comes from running the
tool itself during the warm-start. `solution` is the bare answer (`\boxed{9716}`), for the no-tool baseline's
warm-start (`agent.env='' data.solution_key=solution`). Held-out products never appear in train.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent


def tool_call(name: str, arguments: dict) -> str:
    """A call in the Hermes / Qwen format the tool environment parses, written compactly (every character is a
    token for the tiny model)."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}, separators=(",", ":")) + "</tool_call>"


def rows(n: int, rng: random.Random, taken: set[tuple[int, int]]) -> list[dict]:
    out = []
    while len(out) < n:
        a, b = rng.randint(100, 999), rng.randint(10, 99)
        if (a, b) in taken:
            continue
        taken.add((a, b))
        expression = f"{a}*{b}"
        out.append({"prompt": f"What is {expression}?", "answer": str(a * b),
                    "demo": [tool_call("calculator", {"expression": expression}), f"\\boxed{{{a * b}}}"],
                    "solution": f"\\boxed{{{a * b}}}"})
    return out


def main() -> None:
    rng, taken = random.Random(0), set()
    test = rows(200, rng, taken)
    train = rows(2000, rng, taken)
    for name, data in (("calculator_train.jsonl", train), ("calculator_test.jsonl", test)):
        (HERE / name).write_text("".join(json.dumps(r) + "\n" for r in data))
        print(f"wrote {HERE / name}: {len(data)} rows")


if __name__ == "__main__":
    main()
