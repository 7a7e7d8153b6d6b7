"""Black-box agent programs: `agent.program=module:function`, a function `(base_url, row) -> reward` that
talks to the rollout through the plain `openai` client with its own loop and tools. It may return
`{"reward": r, "formatted": bool}` instead: `formatted` says whether its reward function parsed an answer from the
model (what the format rate and the `answer` end reason count); for a bare number, a reward of 1 counts as formatted
and anything less does not, as for a reward function that returns no `formatted`.

`run_programs` runs one episode per (row, sample) concurrently, each in a thread with its own session of the
`OpenAIServer`, and returns each episode's reward with the trajectories of tokens its calls sampled. An
episode whose program raises, returns no number or runs past `timeout_s` gets reward 0 and a named error (the
episode is logged, the run goes on). Python cannot stop a thread: a program past its deadline is abandoned
(a daemon thread); its session is closed, so its next call to the server fails and it ends.

A program that raises `EnvironmentFailed` (its environment, not the model, went wrong) is rerun in a fresh
session up to `retries` times; still failing, the episode is marked `env_failed` and its group is excluded from
the step (`agent_rollout.program_result`). With `refuse_rerender` (environments that drive the model, e.g.
verifiers), so is an episode whose calls do not extend one another (it re-rendered its history differently from
the tokens sampled): no one trajectory holds the episode as sampled, so it is refused by name rather than trained
on in part. A user's own program keeps the trajectory holding its last call.
A program may return `{"reward", "formatted", "scores": {name: value}}`; scores are logged as `reward/<name>`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import math
import numbers
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer
from rlinf_like.workers.rollout.agentic.openai_sessions import SessionCall, SessionTrajectory, session_trajectories

log = logging.getLogger(__name__)

AgentProgram = Callable[[str, dict[str, Any]], float | dict]  # a bool counts as 1 or 0


class EnvironmentFailed(RuntimeError):
    """Raised by a program whose environment failed (a tool server died, the env raised or timed out)."""


@dataclass(kw_only=True)
class ProgramResult:
    """One episode: the program run on `rows[row_index]`, its `sample_index`-th time."""

    row_index: int
    sample_index: int
    session_id: str
    reward: float  # 0 when `error` is set
    formatted: bool  # the program's reward function parsed an answer (its "formatted", else reward >= 1)
    error: str | None  # "ValueError: ...", "timed out after 30 s", ...
    trajectories: list[SessionTrajectory]  # what its calls sampled (kept on error too: the caller decides)
    calls: list[SessionCall]
    seconds: float
    env_failed: bool = False  # its environment kept failing, or it re-rendered its history: exclude its group
    retries: int = 0  # reruns in a fresh session after EnvironmentFailed
    scores: dict[str, float] = field(default_factory=dict)  # the program's named reward components


def resolve_program(spec: str, key: str = "agent.program") -> AgentProgram:
    """The function `spec` ("module:function") names; refuses one that cannot be called as (base_url, row)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{key}={spec!r}: give module:function, e.g. examples.agentic.openai_agent:solve")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or whatever the module raised while importing
        raise ValueError(f"{key}={spec!r}: module {module_name!r} cannot be imported ({type(e).__name__}: {e}); "
                         f"is it on PYTHONPATH?") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"{key}={spec!r}: module {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise ValueError(f"{key}={spec!r}: {attr!r} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind("http://base-url", {})
    except TypeError as e:
        raise ValueError(f"{key}={spec!r}: {attr}{inspect.signature(fn)} cannot be called as (base_url, row) "
                         f"({e})") from e
    except ValueError:  # no signature to read (a builtin): let the call tell
        pass
    return fn


def run_programs(program: AgentProgram, server: OpenAIServer, rows: Sequence[dict[str, Any]], samples_per_row: int,
                 timeout_s: float, session_prefix: str = "ep", retries: int = 0,
                 refuse_rerender: bool = False) -> list[ProgramResult]:
    """Run `program` `samples_per_row` times on each row, all at once, each episode in its own session (a fresh
    one per rerun after `EnvironmentFailed`, at most `retries`); results in (row, sample) order."""
    episodes = [(r, s, f"{session_prefix}-{r}-{s}") for r in range(len(rows)) for s in range(samples_per_row)]
    outcomes: list[dict[str, Any]] = [{"sessions": []} for _ in episodes]
    threads = []
    start = time.monotonic()
    for (r, s, session_id), outcome in zip(episodes, outcomes):
        thread = threading.Thread(target=_episode, args=(program, server, session_id, dict(rows[r]), outcome, retries),
                                  daemon=True, name=f"agent-{session_id}")
        thread.start()
        threads.append(thread)
    results = []
    for (r, s, session_id), outcome, thread in zip(episodes, outcomes, threads):
        thread.join(max(0.0, start + timeout_s - time.monotonic()))
        if thread.is_alive():
            outcome = {**outcome, "error": f"timed out after {timeout_s:g} s", "seconds": time.monotonic() - start}
        sessions = list(outcome["sessions"])  # closed: an abandoned program's next call fails
        for earlier in sessions[:-1]:
            server.pop_session(earlier)  # a failed attempt's calls train nothing
        calls = server.pop_session(sessions[-1]) if sessions else []
        results.append(_result(r, s, sessions[-1] if sessions else session_id, outcome, calls, refuse_rerender))
    return results


def _result(r: int, s: int, session_id: str, outcome: dict[str, Any], calls: list[SessionCall],
            refuse_rerender: bool = False) -> ProgramResult:
    trajectories = session_trajectories(calls)
    error, env_failed = outcome.get("error"), outcome.get("env_failed", False)
    if error is None and refuse_rerender and len(trajectories) > 1:
        error, env_failed = (f"re-rendered history: its {len(calls)} calls make {len(trajectories)} separate "
                             f"trajectories (a call's prompt does not start with the tokens sampled before it: the "
                             f"program or the chat template rewrote an earlier turn), so none holds the episode "
                             f"as sampled"), True
    if error is not None:
        log.warning("agent program episode %s (row %d, sample %d): %s", session_id, r, s, error)
    return ProgramResult(row_index=r, sample_index=s, session_id=session_id,
                         reward=0.0 if error else outcome["reward"],
                         formatted=False if error else outcome["formatted"], error=error,
                         trajectories=trajectories, calls=calls, seconds=outcome["seconds"], env_failed=env_failed,
                         retries=outcome.get("retries", 0), scores={} if error else outcome.get("scores", {}))


def _episode(program: AgentProgram, server: OpenAIServer, session_id: str, row: dict[str, Any],
             outcome: dict[str, Any], retries: int) -> None:
    began = time.monotonic()
    for attempt in range(retries + 1):
        session = session_id if attempt == 0 else f"{session_id}-retry{attempt}"
        outcome["sessions"].append(session)
        outcome["retries"] = attempt
        try:
            _run_once(program, server.base_url(session), row, outcome)
            break
        except EnvironmentFailed as e:
            outcome.update(error=f"EnvironmentFailed: {e}", env_failed=True)
        except BaseException as e:  # anything the user's program does ends this episode only
            outcome.update(error=f"{type(e).__name__}: {e}", env_failed=False)
            break
    outcome["seconds"] = time.monotonic() - began


def _run_once(program: AgentProgram, base_url: str, row: dict[str, Any], outcome: dict[str, Any]) -> None:
    value = program(base_url, row)
    formatted, scores = None, {}
    if isinstance(value, dict):
        formatted, scores = value.get("formatted"), value.get("scores") or {}
        value = value.get("reward")
    if not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise TypeError(f"the program must return a finite number (the reward), or a dict with one under "
                        f"'reward', got {value!r}")
    outcome.update(reward=float(value), formatted=float(value) >= 1.0 if formatted is None else bool(formatted),
                   scores={str(k): float(v) for k, v in scores.items()}, error=None, env_failed=False)
