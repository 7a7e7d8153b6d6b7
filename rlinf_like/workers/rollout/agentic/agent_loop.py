"""Multi-turn rollouts: every sample is an episode of model turns and environment answers, all of them at once.

Each episode runs in its own thread: it submits its next turn to the `EngineClient` (the whole trajectory so far
as the prompt, n=1), waits for it, hands the decoded text to its environment's `step` and appends the answer as
tokens (`episode.py`, `chat_tokens.py`). While one episode waits on its environment (a tool call blocks), the
engine keeps decoding the others, and a turn submitted mid-step joins the running batch: continuous batching
across turns, where a lock-step loop would leave the engine idle while the slowest tool of a turn runs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict

from rlinf_like.config.validate import structure
from rlinf_like.envs.text import TextEnv
from rlinf_like.workers.rollout.agentic.chat_tokens import ChatTokens
from rlinf_like.workers.rollout.engines.engine_client import EngineClient
from rlinf_like.workers.rollout.agentic.episode import END_REASONS, AgentLimits, Episode, common_prompt, group_result
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

__all__ = ["END_REASONS", "AgentLimits", "AgentLoop"]


class AgentLoop:
    def __init__(self, client: EngineClient, tokenizer, chat_template: str | None,
                 make_env: Callable[[], TextEnv], limits: AgentLimits):
        """`chat_template`: Jinja text, a `.jinja` file, or None for the tokenizer's own."""
        structure(AgentLimits, asdict(limits), path="agent")  # bounds, naming the key
        self.client, self.tokenizer, self.chat_template = client, tokenizer, chat_template
        self.make_env, self.limits = make_env, limits
        self._chats: dict[str, ChatTokens] = {}
        self._lock = threading.Lock()
        self.chat(())  # a template that cannot grow as tokens is refused here, before any episode

    def chat(self, tools) -> ChatTokens:
        """The conversation renderer for one tool list (environments of one kind share it)."""
        key = json.dumps(list(tools), sort_keys=True, default=str)
        with self._lock:
            if key not in self._chats:
                self._chats[key] = ChatTokens(self.tokenizer, self.chat_template, tools)
            return self._chats[key]

    def episode(self, request: RolloutRequest, sample: int) -> Episode:
        """One sample's episode with a fresh environment (not yet reset)."""
        env = self.make_env()
        return Episode(request_id=request.request_id, sample=sample, sampling=request.sampling, limits=self.limits,
                       max_context=self.client.max_context, env=env, chat=self.chat(env.tools))

    def run(self, requests: list[RolloutRequest], rows: list[dict]) -> list[RolloutResult]:
        """Request i is row i's task: its `n` episodes (samples), sampled with its `sampling`; every episode of
        every request runs concurrently. An episode whose environment failed reruns with a fresh environment up to
        `limits.env_retries` times, the reruns together; a group with one still failing is marked `excluded`. One
        result per request, in order."""
        if len(requests) != len(rows):
            raise ValueError(f"AgentLoop.run: {len(requests)} requests but {len(rows)} rows; request i is row i's")
        groups = [[self.episode(request, sample) for sample in range(request.n)] for request in requests]
        # env calls run here, so that one past limits.env_timeout_s can be left behind (a thread cannot be killed):
        # room for one call per episode and attempt, so calls left hanging do not hold up the reruns
        episodes = sum(r.n for r in requests) * (self.limits.env_retries + 1)
        self._env_calls = ThreadPoolExecutor(max_workers=max(episodes, 1), thread_name_prefix="env")
        try:
            self._play([(e, request, row) for group, request, row in zip(groups, requests, rows) for e in group])
            for _ in range(self.limits.env_retries):
                failed = [(i, j) for i, group in enumerate(groups) for j, e in enumerate(group) if e.env_failed]
                if not failed:
                    break
                for i, j in failed:
                    retries = groups[i][j].info.retries + 1
                    groups[i][j] = self.episode(requests[i], j)
                    groups[i][j].info.retries = retries
                self._play([(groups[i][j], requests[i], rows[i]) for i, j in failed])
        finally:
            self._env_calls.shutdown(wait=False, cancel_futures=True)
        return [group_result(request, group, self.client.engine.version) for request, group in zip(requests, groups)]

    def _play(self, jobs: list[tuple[Episode, RolloutRequest, dict]]) -> None:
        """Reset, then run to their ends, these episodes; their first turns go to the engine together, one batch."""
        with ThreadPoolExecutor(max_workers=max(len(jobs), 1), thread_name_prefix="episode") as pool:
            try:
                list(pool.map(lambda job: self._start(job[0], job[2]), jobs))
                by_request: dict[str, tuple[RolloutRequest, list[Episode]]] = {}
                for episode, request, _ in jobs:
                    by_request.setdefault(request.request_id, (request, []))[1].append(episode)
                for request, episodes in by_request.values():
                    common_prompt(request, episodes)
                episodes = [episode for episode, _, _ in jobs]
                first = [episode.next_request() for episode in episodes]
                futures = iter(self.client.submit_many([request for request in first if request is not None]))
                firsts = [None if request is None else next(futures) for request in first]
                list(pool.map(self._drive, episodes, firsts))
            finally:
                for episode, _, _ in jobs:
                    episode.close_env()

    def _env(self, what: str, call, *args):
        """`call(*args)` within limits.env_timeout_s, raising TimeoutError naming `what` past it."""
        future = self._env_calls.submit(call, *args)
        try:
            return future.result(timeout=self.limits.env_timeout_s)
        except FutureTimeout:
            raise TimeoutError(f"{what} took longer than agent.env_timeout_s={self.limits.env_timeout_s}") from None

    def _start(self, episode: Episode, row: dict) -> None:
        """Reset the episode's environment for `row`; an environment that fails there ends its episode."""
        try:
            messages = self._env("env.reset", episode.env.reset, row)
        except Exception as error:  # noqa: BLE001
            episode.end("error", f"env.reset: {error!r}")
            return
        episode.start(messages)

    def _drive(self, episode: Episode, first: Future[RolloutResult] | None) -> None:
        """Turns until the episode ends: the engine's turn (the first one already submitted), then the
        environment's answer."""
        pending = first
        while pending is not None:
            try:
                result = pending.result()
            except Exception as error:  # noqa: BLE001 - the engine failed: this episode ends, as all will
                episode.end("error", f"engine: {error!r}")
                return
            text = episode.record_turn(result)
            if text is None:
                return
            began = time.perf_counter()
            try:
                step = self._env("env.step", episode.env.step, text)
            except Exception as error:  # noqa: BLE001 - a failing environment ends its own episode only
                episode.info.env_wait_s += time.perf_counter() - began
                episode.end("error", f"env.step: {error!r}")
                return
            episode.record_env(step, time.perf_counter() - began)
            request = episode.next_request()
            try:
                pending = None if request is None else self.client.submit(request)
            except RuntimeError as error:  # closed under it
                episode.end("error", f"engine: {error!r}")
                return
