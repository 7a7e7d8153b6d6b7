"""What goes into a rollout engine and what comes out: plain dataclasses, the same for every engine."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

FINISH_REASONS = ("stop", "length", "abort", "error")


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 64
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # besides the model's EOS ids
    stop_strings: tuple[str, ...] = ()  # needs the engine's tokenizer
    ignore_eos: bool = False
    seed: int | None = None  # same seed, same samples (whatever else is in the batch)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SampleProgress:
    """What one sample of a migrated request had generated when its replica stopped: the engine that
    continues it starts from here (`finish_reason` set: that sample is done and kept as it is)."""

    tokens: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    finish_reason: str = ""

    @property
    def done(self) -> bool:
        return self.finish_reason not in ("", "abort")


@dataclass(frozen=True)
class RolloutRequest:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = SamplingParams()
    n: int = 1  # samples per prompt (a GRPO group)
    progress: tuple[SampleProgress, ...] = ()  # a migrated request: each sample's progress (see `continuation`)
    # multi-turn rollouts (the `agent` section): the task's row, which the environment or agent program starts from
    row: dict | None = None

    def unfinished(self) -> list[int]:
        """Indices of the samples an engine still has to generate."""
        return [j for j in range(self.n) if not (self.progress and self.progress[j].done)]


@dataclass(kw_only=True)
class EpisodeInfo:
    """How one multi-turn sample went (`workers/rollout/agentic/agent_loop.py`)."""

    turns: int = 0  # model turns generated
    # answer (the env ended it, or the env's own TextStep.end_reason), max_turns, max_total_tokens, length (a turn
    # hit max_new_tokens_per_turn without its end-of-turn token), context (the engine's max context), error; an agent
    # program's episode: answer where its reward function parsed an answer (`program_formatted`), else no_answer
    end_reason: str = ""
    env_reward: float = 0.0  # the sum of the env's per-turn rewards
    tool_calls: int = 0  # summed from the env's TextStep.info counters of these names
    malformed_calls: int = 0
    env_wait_s: float = 0.0  # seconds spent in env.step
    error: str = ""  # what went wrong, when end_reason is error
    retries: int = 0  # times the episode was rerun with a fresh environment after its environment failed
    program_reward: float | None = None  # agent.program: the reward the program returned, which is the sample's
    program_formatted: bool = False  # agent.program: its reward function parsed an answer (`ProgramResult.formatted`)
    scores: dict[str, float] = field(default_factory=dict)  # named reward components (a verifiers rubric's functions)


@dataclass
class RolloutResult:
    """All `n` samples of one request. `logprobs[i][t]` is log p(token t | prefix) of sample i under
    softmax(logits / temperature) (temperature 1 when greedy), before top-k / top-p filtering."""

    request_id: str
    prompt_ids: list[int]
    response_ids: list[list[int]] = field(default_factory=list)
    logprobs: list[list[float]] = field(default_factory=list)
    finish_reasons: list[str] = field(default_factory=list)
    version: int = 0  # policy (weight) version that generated it (when it started)
    error: str | None = None  # set when the request was rejected; then no samples
    # per sample, the version of each token's weights; differs from `version` only when the weights changed while
    # it decoded (runner.schedule=async). Empty where an engine does not track it.
    token_versions: list[list[int]] = field(default_factory=list)
    # multi-turn rollouts only (empty otherwise): per sample, 1 on the model's tokens and 0 on the ones the
    # environment's messages added (their logprobs are 0.0); and how each sample's episode went
    response_masks: list[list[int]] = field(default_factory=list)
    episodes: list[EpisodeInfo] = field(default_factory=list)
    # non-empty: an episode's environment still failed after agent.env_retries fresh tries, so the whole group is
    # out of the step (keeping the others would skew the group's advantages); the last error
    excluded: str = ""
    # rollout.return_routes, per sample: [prompt + response tokens, MoE layers, k] expert ids (uint8; int16 past 256
    # experts), the experts every MoE layer ran each token through while sampling, aligned with prompt_ids +
    # response_ids; the last response token ran through no pass, and its row is zeros
    routes: list[Any] = field(default_factory=list)

    def oldest_version(self) -> int:
        """The oldest weights any of its tokens came from."""
        return min((v for versions in self.token_versions for v in versions), default=self.version)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def partial(self) -> bool:
        """Some sample was stopped by an abort before it finished (see `continuation`)."""
        return "abort" in self.finish_reasons


def continuation(request: RolloutRequest, partial: RolloutResult) -> RolloutRequest:
    """`request` to be served elsewhere from where `partial` (its aborted result) stopped. The samples
    continue with the same per-sample noise (sampling.py), so they draw the tokens they would have drawn."""
    progress = tuple(SampleProgress(tuple(t), tuple(lp), reason)
                     for t, lp, reason in zip(partial.response_ids, partial.logprobs, partial.finish_reasons))
    return replace(request, progress=progress)


def request_error(request: RolloutRequest, max_context: int, max_samples: int) -> str | None:
    """Why `request` cannot be served (naming it), or None."""
    where = f"request {request.request_id!r}"
    s = request.sampling
    if len(request.prompt_ids) == 0:
        return f"{where}: empty prompt"
    if len(request.prompt_ids) >= max_context:
        return f"{where}: prompt of {len(request.prompt_ids)} tokens does not fit the context of {max_context}"
    if s.max_new_tokens <= 0:
        return f"{where}: max_new_tokens must be > 0, got {s.max_new_tokens}"
    if not 1 <= request.n <= max_samples:
        return f"{where}: n must be in 1..{max_samples} (the engine's batch slots), got {request.n}"
    if s.temperature < 0 or s.top_k < 0 or not 0.0 < s.top_p <= 1.0:
        return f"{where}: needs temperature >= 0, top_k >= 0, 0 < top_p <= 1; got {s}"
    if request.progress:
        if len(request.progress) != request.n:
            return f"{where}: progress has {len(request.progress)} samples, n is {request.n}"
        if s.seed is None and not s.greedy:
            return f"{where}: continuing a sampled request needs sampling.seed (to draw the same noise)"
        if any(len(request.prompt_ids) + len(p.tokens) >= max_context for p in request.progress if not p.done):
            return f"{where}: a sample's progress already fills the context of {max_context}"
    return None


def collected(request: RolloutRequest, samples: list[tuple[list[int], list[float], str]], version: int) -> RolloutResult:
    """A request's result from its samples' (tokens, logprobs, finish reason), in sample order."""
    result = RolloutResult(request.request_id, list(request.prompt_ids), version=version)
    for tokens, logprobs, reason in samples:
        result.response_ids.append(tokens)
        result.logprobs.append(logprobs)
        result.finish_reasons.append(reason)
    return result


def rejected(request: RolloutRequest, error: str, version: int) -> RolloutResult:
    return RolloutResult(request.request_id, list(request.prompt_ids), version=version, error=error)
