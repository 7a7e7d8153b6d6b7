"""`ToolEnv`: the model answers a task, calling tools on the way (`agent.env=tools`).

Each assistant message is parsed for Hermes tool calls (`tool_calls.py`). With none, the episode ends: the message
is the answer. Otherwise every call runs and its result comes back as one `tool` message, in order; a malformed
call's message says what is wrong, so the model can fix it next turn. A call that runs past the per-tool time
limit (`agent.tool_options.timeout_s`) ends the episode (end reason `tool_timeout`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlinf_like.envs.text.base import Message, TextEnv, TextStep
from rlinf_like.envs.text.tool_calls import MalformedCall, ToolCall, parse_tool_calls
from rlinf_like.envs.tools import TOOLS, Tool, ToolOptions, build_tools

COUNTERS = ("tool_calls", "malformed_calls", "tool_errors", "tool_timeouts")


class ToolEnv(TextEnv):
    def __init__(self, *, tools: list[str], options: ToolOptions | Mapping[str, Any] | None = None,
                 system_prompt: str = "", prompt_key: str = "prompt"):
        if not tools:
            raise ValueError("agent.tools is empty: a tool environment needs at least one tool")
        if options is None:
            options = ToolOptions()
        elif not isinstance(options, ToolOptions):
            options = ToolOptions.from_mapping(options)
        self.options, self.system_prompt, self.prompt_key = options, system_prompt, prompt_key
        self._tools: dict[str, Tool] = build_tools(tools, options)
        self.tools = tuple(tool.schema() for tool in self._tools.values())
        self.totals = dict.fromkeys(COUNTERS, 0.0)  # over the episode; each step's info holds that step's counts

    @classmethod
    def check(cls, cfg) -> None:
        for name in cfg.tools:
            TOOLS.get(name)  # unknown: names agent.tools and the choices
        if not cfg.tools:
            raise ValueError(f"agent.env=tools needs agent.tools, some of {TOOLS.names()}")

    @classmethod
    def from_config(cls, cfg, system_prompt: str = "") -> ToolEnv:
        return cls(tools=list(cfg.tools), options=cfg.tool_options, system_prompt=system_prompt)

    def reset(self, row: dict[str, Any]) -> list[Message]:
        if self.prompt_key not in row:
            raise KeyError(f"agent.prompt_key={self.prompt_key!r} is not a field of the task row; it has "
                           f"{sorted(row)}")
        self.totals = dict.fromkeys(COUNTERS, 0.0)
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + [{"role": "user", "content": str(row[self.prompt_key])}]

    def step(self, assistant_message: str) -> TextStep:
        calls = parse_tool_calls(assistant_message, known=self._tools)
        info = dict.fromkeys(COUNTERS, 0.0)
        if not calls:
            return TextStep(messages=None, done=True, info=info, end_reason="answer")
        messages = []
        for position, call in enumerate(calls):
            if position >= self.options.max_calls_per_turn:  # bounds the time one message can cost
                info["tool_errors"] += 1
                name = call.name if isinstance(call, ToolCall) else ""
                content = (f"error: not run: at most {self.options.max_calls_per_turn} tool calls are run per "
                           "message")
            elif isinstance(call, MalformedCall):
                info["malformed_calls"] += 1
                name, content = "", f"error: malformed tool call: {call.error}"
            else:
                info["tool_calls"] += 1
                result = self._tools[call.name].call(call.arguments)
                info["tool_errors"] += result.status == "error"
                info["tool_timeouts"] += result.status == "timeout"
                name, content = call.name, result.text
            messages.append({"role": "tool", "name": name, "content": content})
        for key, value in info.items():
            self.totals[key] += value
        if info["tool_timeouts"]:  # the per-tool time limit is an episode limit: it ends here, named
            return TextStep(messages=messages, info=info, done=True, end_reason="tool_timeout")
        return TextStep(messages=messages, info=info)

    def close(self) -> None:
        for tool in self._tools.values():
            tool.close()
