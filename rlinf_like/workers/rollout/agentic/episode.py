"""One multi-turn sample as a token trajectory: which request each turn sends, what each turn's result and each
environment answer add, and when the episode ends (and why). No threads and no engine here: `agent_loop.py`
drives episodes concurrently over an `EngineClient`, and `bench/agentic.py` drives the same episodes in
lock-step batches.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from rlinf_like.config.validate import bounded
from rlinf_like.envs.text import Message, TextEnv, TextStep
from rlinf_like.workers.rollout.agentic.chat_tokens import ChatTokens
from rlinf_like.workers.rollout.types import EpisodeInfo, RolloutRequest, RolloutResult, SamplingParams

# EpisodeInfo.end_reason values set here (an env that ends the episode may name its own, e.g. tool_timeout)
END_REASONS = ("answer", "max_turns", "max_total_tokens", "length", "context", "error")


@dataclass(kw_only=True)
class AgentLimits:
    """When an episode ends, besides the environment ending it (the `agent` section's keys)."""

    max_turns: int = bounded(4, ge=1)  # model turns
    # the response side's context budget: the model's tokens plus the environment's (tool results, prompts)
    max_total_tokens: int = bounded(1024, ge=1)
    max_new_tokens_per_turn: int = bounded(256, ge=1)  # a turn that reaches it without ending ends the episode
    # an episode whose environment raised or timed out is rerun with a fresh environment this many times; then its
    # group is excluded (`RolloutResult.excluded`). A bare loop retries nothing; runs take agent.env_retries
    env_retries: int = bounded(0, ge=0)
    env_timeout_s: float | None = bounded(None, gt=0)  # env.reset / env.step longer than this is a failure; None: none


def turn_seed(seed: int | None, sample: int, turn: int) -> int | None:
    """The sampling seed of one turn of one sample, derived from its request's seed (None stays None)."""
    if seed is None:
        return None
    digest = hashlib.blake2b(f"{seed}/{sample}/{turn}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


class Episode:
    def __init__(self, *, request_id: str, sample: int, sampling: SamplingParams, limits: AgentLimits,
                 max_context: int, env: TextEnv, chat: ChatTokens):
        self.request_id, self.sample, self.sampling, self.limits = request_id, sample, sampling, limits
        self.max_context, self.env, self.chat = max_context, env, chat
        self.prompt_ids: list[int] | None = None  # set by start()
        self.response_ids: list[int] = []
        self.logprobs: list[float] = []
        self.masks: list[int] = []
        self.versions: list[int] = []
        self.info = EpisodeInfo()
        self.version: int | None = None  # the weights' version at the first turn
        self.last_finish = "error"  # the last turn's engine finish reason (error: no turn came back)
        self._ended_on_end_of_turn = True

    @property
    def done(self) -> bool:
        return bool(self.info.end_reason)

    @property
    def env_failed(self) -> bool:
        """Its environment raised or timed out (an engine failure is not the environment's)."""
        return self.info.end_reason == "error" and self.info.error.startswith("env.")

    def end(self, reason: str, error: str = "") -> None:
        if not self.done:
            self.info.end_reason, self.info.error = reason, error

    def start(self, messages: list[Message]) -> None:
        """Begin with the environment's opening messages (what its reset returned), rendered as the prompt."""
        self.prompt_ids = self.chat.prompt_ids(messages)

    def next_request(self) -> RolloutRequest | None:
        """The next turn's request (the whole trajectory so far as its prompt), or None once the episode ended."""
        if self.done:
            return None
        budget = self.limits.max_total_tokens - len(self.response_ids)
        length = len(self.prompt_ids) + len(self.response_ids)
        if length >= self.max_context:  # the engine needs room for one token at least
            self.end("context")
            return None
        if budget <= 0:
            self.end("max_total_tokens")
            return None
        s = self.sampling
        stops = s.stop_token_ids if self.chat.end_of_turn in s.stop_token_ids else (*s.stop_token_ids,
                                                                                     self.chat.end_of_turn)
        sampling = replace(s, max_new_tokens=min(self.limits.max_new_tokens_per_turn, budget), stop_token_ids=stops,
                           seed=turn_seed(s.seed, self.sample, self.info.turns))
        return RolloutRequest(f"{self.request_id}/{self.sample}/{self.info.turns}",
                              self.prompt_ids + self.response_ids, sampling, n=1)

    def record_turn(self, result: RolloutResult) -> str | None:
        """Append a turn's tokens as the engine returned them; the text for the environment, or None when the
        episode ends here."""
        if not result.ok:
            self.end("error", result.error)
            return None
        tokens, logprobs, reason = result.response_ids[0], result.logprobs[0], result.finish_reasons[0]
        versions = result.token_versions[0] if result.token_versions else [result.version] * len(tokens)
        self.version = result.version if self.version is None else self.version
        self.response_ids += tokens
        self.logprobs += logprobs
        self.masks += [1] * len(tokens)
        self.versions += versions
        self.info.turns += 1
        self.last_finish = reason
        if reason == "abort":
            self.end("error", "aborted: the engine client was closed while the turn decoded")
        elif reason != "stop":  # length: cut by the context, the episode's budget or the turn's own limit
            if len(self.prompt_ids) + len(self.response_ids) >= self.max_context:
                self.end("context")
            elif len(self.response_ids) >= self.limits.max_total_tokens:
                self.end("max_total_tokens")
            else:
                self.end("length")
        if self.done:
            return None
        self._ended_on_end_of_turn = bool(tokens) and tokens[-1] == self.chat.end_of_turn
        return self.chat.text(tokens)

    def record_env(self, step: TextStep, wait_s: float) -> None:
        """Add the environment's answer: its reward and counters, and its messages as tokens (unless the
        episode ends here)."""
        self.info.env_wait_s += wait_s
        self.info.env_reward += step.reward
        self.info.tool_calls += int(step.info.get("tool_calls", 0))
        self.info.malformed_calls += int(step.info.get("malformed_calls", 0))
        if step.done:
            self.end(step.end_reason or "answer")
            return
        if self.info.turns >= self.limits.max_turns:
            self.end("max_turns")
            return
        ids = self.chat.env_ids(list(step.messages or []), self._ended_on_end_of_turn)
        if len(self.response_ids) + len(ids) > self.limits.max_total_tokens:
            self.end("max_total_tokens")
            return
        if len(self.prompt_ids) + len(self.response_ids) + len(ids) >= self.max_context:
            self.end("context")
            return
        self.response_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.masks += [0] * len(ids)
        self.versions += [self.versions[-1] if self.versions else 0] * len(ids)  # no policy wrote them

    def close_env(self) -> None:
        try:
            self.env.close()
        except Exception as error:  # noqa: BLE001 - the episode's tokens stand; note what failed
            self.info.error = self.info.error or f"env.close: {error!r}"


def common_prompt(request: RolloutRequest, episodes: list[Episode]) -> list[int]:
    """The prompt all of a request's started episodes share (an environment whose reset varies is refused)."""
    prompts = {tuple(e.prompt_ids) for e in episodes if e.prompt_ids is not None}
    if len(prompts) > 1:
        raise ValueError(f"request {request.request_id!r}: the environment's reset gave its samples different "
                         f"prompts ({len(prompts)} of them); reset(row) must depend on the row alone")
    return list(next(iter(prompts), ()))


def group_result(request: RolloutRequest, episodes: list[Episode], version: int) -> RolloutResult:
    """The request's result: one sample per episode (`version`: the engine's, if no turn came back)."""
    started = [e.version for e in episodes if e.version is not None]
    return RolloutResult(
        request.request_id, common_prompt(request, episodes),
        response_ids=[e.response_ids for e in episodes], logprobs=[e.logprobs for e in episodes],
        finish_reasons=[e.last_finish for e in episodes], version=min(started, default=version),
        token_versions=[e.versions for e in episodes], response_masks=[e.masks for e in episodes],
        episodes=[e.info for e in episodes],
        excluded=next((f"{e.info.error} (request {e.request_id}, sample {e.sample}, after {e.info.retries} retries)"
                       for e in episodes if e.env_failed), ""))
