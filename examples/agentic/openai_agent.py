"""A small agent written against the plain `openai` client, trained with
`agent.program=openai_agent:solve` (`--config-name openai_agent` of main_agent.py).

A task row has the user message under `prompt` (the runner fills in `data.prompt_template`) and the reference
answer under `answer`.

It asks the model the row's prompt. When a reply holds a line `CALC: <arithmetic>`, the agent computes
it with its own calculator and sends `RESULT: <value>` back as the next user message; when a reply holds
`ANSWER: <x>` (or the turns run out), the episode ends and the reward is 1 if the answer equals
`row["answer"]`, else 0; `formatted` says whether a reply held an `ANSWER:` line (the run's format rate). The agent
knows nothing of the trainer: it only gets a base URL.
"""

from __future__ import annotations

import ast
import operator
import re

import openai

SYSTEM = ("Solve the problem. To compute, write a line `CALC: <expression>` and wait for `RESULT: <value>`. "
          "End with a line `ANSWER: <number>`.")
MAX_TURNS = 3
MAX_TOKENS = 24  # per reply

_CALC = re.compile(r"^CALC:\s*(.+)$", re.MULTILINE)
_ANSWER = re.compile(r"^ANSWER:\s*(.+)$", re.MULTILINE)
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> float | int:
    """The value of an arithmetic expression (numbers, + - * / // % **, parentheses); ValueError otherwise."""
    def value(node: ast.AST):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            if isinstance(node.op, ast.Pow) and abs(value(node.right)) > 64:  # keep a reply from hanging the agent
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return value(ast.parse(expression.strip(), mode="eval").body)
    except (SyntaxError, ZeroDivisionError, OverflowError) as e:
        raise ValueError(f"cannot compute {expression!r}: {e}") from e


def next_step(reply: str) -> tuple[str, str]:
    """What the agent does with a reply: ("answer", text), ("tool", the message to send back) or ("none", "")."""
    answer = _ANSWER.search(reply)
    if answer:
        return "answer", answer.group(1).strip()
    calc = _CALC.search(reply)
    if calc:
        try:
            return "tool", f"RESULT: {calculate(calc.group(1))}"
        except ValueError as e:
            return "tool", f"ERROR: {e}"
    return "none", ""


def solve(base_url: str, row: dict) -> dict:
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": str(row["prompt"])}]
    answer, kind = "", "none"
    for _ in range(MAX_TURNS):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=MAX_TOKENS,
                                               temperature=float(row.get("temperature", 1.0)))
        text = reply.choices[0].message.content or ""
        kind, payload = next_step(text)
        if kind != "tool":
            answer = payload if kind == "answer" else text.strip()
            break
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": payload}]
    return {"reward": float(answer == str(row["answer"]).strip()), "formatted": kind == "answer"}
