"""Text environments for multi-turn rollouts: the model writes an assistant message, the environment answers
with new messages (tool results, a user's reply) or ends the episode.

An environment sees text only: the rollout keeps the trajectory as token ids, renders what `step` returns
through the model's chat template and appends those tokens, so the model's own tokens are never re-tokenized
(`workers/rollout/agentic/agent_loop.py`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from rlinf_like.envs.text.config import AgentConfig

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": str, ...}


@dataclass
class TextStep:
    """What the environment answers to one assistant message."""

    messages: list[Message] | None  # appended to the conversation (None or [] when the episode ends)
    reward: float = 0.0  # a per-turn reward, added to the task's final reward
    done: bool = False
    info: dict[str, float] = field(default_factory=dict)  # counters the run logs (tool_calls, malformed_calls, ...)
    end_reason: str = ""  # why it ended, when done ("answer", "tool_timeout", ...)


class TextEnv(ABC):
    """One episode at a time; the rollout builds one instance per sample (`TEXT_ENVS.get(kind)(**options)`)."""

    tools: tuple[dict, ...] = ()  # the tools' JSON schemas, passed to the chat template as `tools=`
    # it runs its own episodes and calls the model through the rollout's OpenAI-compatible endpoint (verifiers):
    # the rollout calls `program(cfg, sampling)` per generate call and runs it as an agent program; reset / step
    # are not used
    drives_model: ClassVar[bool] = False
    data_source: ClassVar[str | None] = None  # the data.source its tasks must come from (None: any)

    @classmethod
    def program(cls, cfg: AgentConfig, sampling):
        """`drives_model` environments: the `(base_url, row) -> reward | dict` program that plays one episode
        with the call's `SamplingParams`."""
        raise NotImplementedError(f"{cls.__name__} does not drive the model (drives_model is False)")

    @classmethod
    def check(cls, cfg: AgentConfig) -> None:
        """What this environment needs of the `agent` section, refused by key before any worker starts."""

    @classmethod
    def from_config(cls, cfg: AgentConfig, system_prompt: str = "") -> TextEnv:
        """One episode's environment from the `agent` section (and `data.system_prompt`)."""
        raise NotImplementedError(f"{cls.__name__} does not say how to build itself from the agent section")

    @abstractmethod
    def reset(self, row: dict[str, Any]) -> list[Message]:
        """The opening messages for a task row (`Problem.fields` plus its `prompt`)."""

    @abstractmethod
    def step(self, assistant_message: str) -> TextStep:
        """The environment's answer to the model's latest message (its decoded text)."""

    def close(self) -> None:
        """Release what the episode holds (processes, files)."""
