"""Tools a model calls in a multi-turn rollout: the `Tool` interface, its options and its registry, `agent.tools`.

A tool takes the JSON arguments of one call and returns the text the model sees. `run` is what a tool implements
(it returns text or raises `ToolError`); `call` is what an environment uses: it never raises, and says whether the
call succeeded, failed or timed out, so the run can count them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from rlinf_like.utils.registry import Registry

SHIPPED_CORPUS = Path(__file__).resolve().parent / "data" / "search_corpus.jsonl"
OPTIONS_KEY = "agent.tool_options"  # where the config keeps a ToolOptions; errors name its fields under it


class ToolError(Exception):
    """A call that failed in a way the model should read about (bad arguments, a crash, a limit)."""


class ToolTimeout(ToolError):
    """A call stopped at its wall-clock limit."""


@dataclass(kw_only=True)
class ToolOptions:
    timeout_s: float = 5.0  # wall-clock limit of one call
    max_output_chars: int = 1000  # what the model sees of one call's output, at most
    python_memory_mb: int = 256  # the python tool's address-space limit
    python_cpu_s: int = 5  # the python tool's CPU-time limit (whole seconds)
    search_corpus: str = str(SHIPPED_CORPUS)  # a JSONL file of {"id", "title", "text"} passages
    search_top_k: int = 3  # passages returned per search
    max_calls_per_turn: int = 8  # calls run from one assistant message; the rest are answered with an error

    def __post_init__(self) -> None:
        positive = {"timeout_s": self.timeout_s, "max_output_chars": self.max_output_chars,
                    "python_memory_mb": self.python_memory_mb, "python_cpu_s": self.python_cpu_s,
                    "search_top_k": self.search_top_k, "max_calls_per_turn": self.max_calls_per_turn}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{OPTIONS_KEY}.{name}={value!r} must be > 0")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> ToolOptions:
        """From a config mapping; an unknown key is refused, naming the allowed ones."""
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ValueError(f"{OPTIONS_KEY}: unknown option(s) {unknown}; allowed: {allowed}")
        return cls(**dict(values))


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    text: str  # what the model sees
    status: Literal["ok", "error", "timeout"] = "ok"


class Tool(ABC):
    name: str = ""
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}  # JSON schema of the arguments

    def __init__(self, options: ToolOptions):
        self.options = options

    def schema(self) -> dict[str, Any]:
        """The OpenAI / Hermes function schema, as chat templates take it in `tools=`."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @abstractmethod
    def run(self, arguments: dict[str, Any]) -> str:
        """The text the model sees; raises ToolError when the call fails."""

    def call(self, arguments: dict[str, Any]) -> ToolResult:
        """`run`, with every failure turned into text the model sees (a tool must never crash the rollout)."""
        try:
            text, status = self.run(arguments), "ok"
        except ToolTimeout as exc:
            text, status = f"error: {exc}", "timeout"
        except ToolError as exc:
            text, status = f"error: {exc}", "error"
        except Exception as exc:  # a bug in a tool is the model's tool error, not the rollout's crash
            text, status = f"error: {type(exc).__name__}: {exc}", "error"
        # a tool that cut its own output keeps its note (it knows the full size); anything longer is cut here
        if len(text) > self.options.max_output_chars + NOTE_ROOM:
            text = truncate(text, self.options.max_output_chars)
        return ToolResult(text=text, status=status)

    def close(self) -> None:
        """Release what the tool holds (most hold nothing between calls)."""

    def string_argument(self, arguments: dict[str, Any], key: str) -> str:
        value = arguments.get(key)
        if not isinstance(value, str) or not value.strip():
            raise ToolError(f"{self.name} needs a non-empty string argument {key!r}, got arguments {arguments}")
        return value


NOTE_ROOM = 160  # characters a tool's own truncation note and an "error: ..." prefix may add to its output


def truncate(text: str, max_chars: int) -> str:
    """At most `max_chars` characters, plus a note saying how much was cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n... [truncated: showing {max_chars} of {len(text)} characters]"


TOOLS: Registry[type[Tool]] = Registry("tool", key="agent.tools")
TOOLS.register("python", "rlinf_like.envs.tools.python_sandbox:PythonTool")  # code in a limited subprocess
TOOLS.register("calculator", "rlinf_like.envs.tools.calculator:CalculatorTool")  # arithmetic, no code
TOOLS.register("search", "rlinf_like.envs.tools.search:SearchTool")  # BM25 over a local corpus


def build_tools(names: Iterable[str], options: ToolOptions) -> dict[str, Tool]:
    """One instance per name, in order; an unknown name is refused naming `agent.tools` and the choices."""
    tools: dict[str, Tool] = {}
    for name in names:
        if name in tools:
            raise ValueError(f"agent.tools lists {name!r} twice")
        tools[name] = TOOLS.get(name)(options)
    return tools
