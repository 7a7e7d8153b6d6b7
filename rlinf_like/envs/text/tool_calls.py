"""Tool calls in the Hermes format that Qwen2.5 / Qwen3 chat templates teach:

    <tool_call>
    {"name": "search", "arguments": {"query": "..."}}
    </tool_call>

several per message. Each block parses to a `ToolCall` or, when the model got the format wrong, a `MalformedCall`
carrying the reason, which the environment shows the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MalformedCall:
    text: str  # the block's text between the tags (to the message's end when unclosed)
    error: str  # what is wrong, worded for the model


def parse_tool_calls(message: str, known: Collection[str] | None = None) -> list[ToolCall | MalformedCall]:
    """Every `<tool_call>` block in order; `known`, when given, are the tool names a call may use."""
    calls: list[ToolCall | MalformedCall] = []
    end = 0
    for match in _BLOCK.finditer(message):
        calls.append(_parse_block(match.group(1), known))
        end = match.end()
    rest = message.find(OPEN, end)
    if rest >= 0:  # an opening tag with no closing one (often: generation cut at max tokens)
        calls.append(MalformedCall(text=message[rest + len(OPEN):].strip(), error=f"unclosed {OPEN} tag: "
                                   f"end each call with {CLOSE}"))
    return calls


def final_text(message: str) -> str:
    """The message without its tool-call blocks (an unclosed one is cut to the end), stripped."""
    text = _BLOCK.sub("", message)
    unclosed = text.find(OPEN)
    return (text if unclosed < 0 else text[:unclosed]).strip()


def _parse_block(body: str, known: Collection[str] | None) -> ToolCall | MalformedCall:
    body = body.strip()
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        return MalformedCall(text=body, error=f"invalid JSON in {OPEN}: {exc}")
    if not isinstance(payload, dict):
        return MalformedCall(text=body, error='a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(text=body, error='a tool call needs a "name" string')
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return MalformedCall(text=body, error=f'"arguments" of {name!r} must be a JSON object, '
                                              f"got {type(arguments).__name__}")
    if known is not None and name not in known:
        return MalformedCall(text=body, error=f"unknown tool {name!r}; available: {sorted(known)}")
    return ToolCall(name=name, arguments=arguments)
