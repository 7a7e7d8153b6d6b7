"""The rollout's multi-turn mode (the `agent` section): a request's samples are episodes against a text
environment (`AgentLoop`), or runs of the user's agent program through the OpenAI-compatible endpoint
(`openai_server.py`, `agent_program.py`). Either way the engine serves every turn of every sample continuously
(`EngineClient`), only for the length of one `generate` call: between calls the rollout may be offloaded and
take new weights as in single-turn mode.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from rlinf_like.envs.text import TEXT_ENVS
from rlinf_like.envs.text.config import AgentConfig
from rlinf_like.workers.rollout.agentic.agent_loop import AgentLimits, AgentLoop
from rlinf_like.workers.rollout.base import RolloutEngine
from rlinf_like.workers.rollout.engines.engine_client import EngineClient
from rlinf_like.workers.rollout.agentic.openai_sessions import SessionTrajectory
from rlinf_like.workers.rollout.types import EpisodeInfo, RolloutRequest, RolloutResult

SERVING_THREADS = 256  # requests whose episodes run at once while serving (each waits on its episodes' threads)


@dataclass(kw_only=True)
class AgentSetup:
    """What the rollout needs for multi-turn mode; the driver builds it from the config."""

    agent: AgentConfig
    chat_template: str | None  # Jinja text; None: the tokenizer's own
    system_prompt: str = ""


class AgentRollout:
    def __init__(self, engine: RolloutEngine, setup: AgentSetup, tokenizer):
        self.engine, self.setup, self.tokenizer = engine, setup, tokenizer
        env = TEXT_ENVS.get(setup.agent.env) if setup.agent.env else None
        self.make_env = (lambda: env.from_config(setup.agent, setup.system_prompt)) if env else None
        self.program = None
        # an environment that runs its own episodes through the endpoint is an agent program built per call,
        # with the call's sampling settings (the trainer's logprobs assume the same temperature)
        self.env_program = env.program if env is not None and env.drives_model else None
        if self.env_program is not None:
            self.make_env = None
        elif setup.agent.program:
            from rlinf_like.workers.rollout.agentic.agent_program import resolve_program

            self.program = resolve_program(setup.agent.program)

    def generate(self, requests: Sequence[RolloutRequest]) -> list[RolloutResult]:
        """Every sample of every request as one episode, all of them at once."""
        if not requests:
            return []
        check_rows(requests)
        client = EngineClient(self.engine)
        try:
            if self.program is not None or self.env_program is not None:
                return self._programs(client, list(requests))
            return self._loop(client, requests[0]).run(list(requests), [r.row for r in requests])
        finally:
            client.close()

    def serve(self, take: Callable[[], list[tuple[RolloutRequest, str]] | None],
              put: Callable[[RolloutResult, str], None], between_steps: Callable[[], None]) -> int:
        """The asynchronous schedule's serving: `take()` hands over (request, key) pairs as they are submitted
        (blocking a little; None once closed); each request's episodes start at once and its result is `put` under
        its key when all are done. `between_steps` runs before every decode step, so new weights arrive mid-episode
        (each token's version is kept). Returns the requests served."""
        client = EngineClient(self.engine)
        client.between_steps = between_steps
        served: list[Future] = []
        try:
            with ThreadPoolExecutor(max_workers=SERVING_THREADS, thread_name_prefix="agent-request") as pool:
                while (batch := take()) is not None:
                    check_rows([request for request, _ in batch])
                    for request, key in batch:
                        served.append(pool.submit(self._serve_one, client, request, key, put))
                    failed = next((f for f in served if f.done() and f.exception()), None)
                    if failed is not None:  # at once: the driver waits on this serve call, not on the group
                        failed.result()
                for future in served:
                    future.result()  # the first failure is raised, naming its request
        finally:
            client.close(abort=any(f.exception() for f in served if f.done()))
        return len(served)

    def _serve_one(self, client: EngineClient, request: RolloutRequest, key: str,
                   put: Callable[[RolloutResult, str], None]) -> None:
        if self.program is not None or self.env_program is not None:
            raise ValueError("runner.schedule=async with agent.program is not built: the endpoint serves one "
                             "generate call at a time")
        put(self._loop(client, request).run([request], [request.row])[0], key)

    def _loop(self, client: EngineClient, request: RolloutRequest) -> AgentLoop:
        a = self.setup.agent
        limits = AgentLimits(max_turns=a.max_turns, max_total_tokens=a.max_total_tokens,
                             max_new_tokens_per_turn=request.sampling.max_new_tokens, env_retries=a.env_retries,
                             env_timeout_s=a.env_timeout_s)
        return AgentLoop(client, self.tokenizer, self.setup.chat_template, self.make_env, limits)

    def _programs(self, client: EngineClient, requests: list[RolloutRequest]) -> list[RolloutResult]:
        from rlinf_like.workers.rollout.agentic.agent_program import run_programs
        from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer

        server = OpenAIServer(client.submit, self.tokenizer, self.setup.chat_template,
                              model_name=os.path.basename(str(self.tokenizer.name_or_path)) or "policy",
                              max_context=client.max_context)
        program = self.program or self.env_program(self.setup.agent, requests[0].sampling)
        server.start()
        try:
            out: dict[str, RolloutResult] = {}
            for n in sorted({r.n for r in requests}):  # every sample of every request at once, per group size
                same = [r for r in requests if r.n == n]
                a = self.setup.agent
                runs = run_programs(program, server, [r.row for r in same], n, a.program_timeout_s,
                                    session_prefix=f"v{self.engine.version}-n{n}", retries=a.env_retries,
                                    refuse_rerender=self.env_program is not None)
                for i, request in enumerate(same):
                    out[request.request_id] = program_result(request, runs[i * n : (i + 1) * n], self.engine.version)
            return [out[r.request_id] for r in requests]
        finally:
            server.close()


def check_rows(requests: Sequence[RolloutRequest]) -> None:
    missing = [r.request_id for r in requests if r.row is None]
    if missing:
        raise ValueError(f"multi-turn rollout: requests {missing[:3]} carry no task row (RolloutRequest.row)")


def program_result(request: RolloutRequest, runs, version: int) -> RolloutResult:
    """A request's samples from its program runs. Each sample trains on the trajectory holding the run's last
    call (a run whose calls do not extend one another leaves earlier, separate trajectories out). The samples'
    shared prompt is their trajectories' common prefix; the rest of each is response with mask 0."""
    chosen: list[SessionTrajectory | None] = [run.trajectories[-1] if run.trajectories else None for run in runs]
    prompts = [t.prompt_ids for t in chosen if t is not None]
    common = prompts[0][: common_prefix(prompts)] if prompts else list(request.prompt_ids)
    result = RolloutResult(request.request_id, list(common), version=min((t.version for t in chosen if t), default=version))
    for run, t in zip(runs, chosen):
        # "answer" only where the program's reward function parsed one (gibberish ends "no_answer")
        end = "error" if run.error else "answer" if run.formatted else "no_answer"
        info = EpisodeInfo(turns=t.num_calls if t else 0, end_reason=end, error=run.error or "",
                           program_reward=run.reward, program_formatted=run.formatted, retries=run.retries,
                           env_wait_s=run.seconds, scores=dict(run.scores))
        if run.env_failed and not result.excluded:
            result.excluded = (f"{run.error} (request {request.request_id}, sample {run.sample_index}, after "
                               f"{run.retries} retries)")
        extra = t.prompt_ids[len(common):] if t else []
        result.response_ids.append(extra + (t.response_ids if t else []))
        result.logprobs.append([0.0] * len(extra) + (t.logprobs if t else []))
        result.response_masks.append([0] * len(extra) + (t.response_mask if t else []))
        result.finish_reasons.append(t.finish_reason if t else "error")
        result.token_versions.append([t.version if t else version] * len(result.response_ids[-1]))
        result.episodes.append(info)
    return result


def common_prefix(sequences: list[list[int]]) -> int:
    """The length of the longest prefix all `sequences` share."""
    n = min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != sequences[0][i] for s in sequences):
            return i
    return n
