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
from dataclasses import dataclass
from typing import Any

from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer
from rlinf_like.workers.rollout.agentic.openai_sessions import SessionCall, SessionTrajectory, session_trajectories

log = logging.getLogger(__name__)

AgentProgram = Callable[[str, dict[str, Any]], float | dict]  # a bool counts as 1 or 0


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
                 timeout_s: float, session_prefix: str = "ep") -> list[ProgramResult]:
    """Run `program` `samples_per_row` times on each row, all at once, each episode in its own session;
    results in (row, sample) order."""
    episodes = [(r, s, f"{session_prefix}-{r}-{s}") for r in range(len(rows)) for s in range(samples_per_row)]
    outcomes: list[dict[str, Any]] = [{} for _ in episodes]
    threads = []
    start = time.monotonic()
    for (r, s, session_id), outcome in zip(episodes, outcomes):
        base_url = server.base_url(session_id)
        thread = threading.Thread(target=_episode, args=(program, base_url, dict(rows[r]), outcome), daemon=True,
                                  name=f"agent-{session_id}")
        thread.start()
        threads.append(thread)
    results = []
    for (r, s, session_id), outcome, thread in zip(episodes, outcomes, threads):
        thread.join(max(0.0, start + timeout_s - time.monotonic()))
        if thread.is_alive():
            outcome = {"error": f"timed out after {timeout_s:g} s", "seconds": time.monotonic() - start}
        calls = server.pop_session(session_id)  # closed: an abandoned program's next call fails
        error = outcome.get("error")
        if error is not None:
            log.warning("agent program episode %s (row %d, sample %d): %s", session_id, r, s, error)
        results.append(ProgramResult(row_index=r, sample_index=s, session_id=session_id,
                                     reward=0.0 if error else outcome["reward"],
                                     formatted=False if error else outcome["formatted"], error=error,
                                     trajectories=session_trajectories(calls), calls=calls,
                                     seconds=outcome["seconds"]))
    return results


def _episode(program: AgentProgram, base_url: str, row: dict[str, Any], outcome: dict[str, Any]) -> None:
    began = time.monotonic()
    try:
        value = program(base_url, row)
        formatted = None
        if isinstance(value, dict):
            formatted = value.get("formatted")
            value = value.get("reward")
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise TypeError(f"the program must return a finite number (the reward), or a dict with one under "
                            f"'reward', got {value!r}")
        outcome["reward"] = float(value)
        outcome["formatted"] = outcome["reward"] >= 1.0 if formatted is None else bool(formatted)
    except BaseException as e:  # anything the user's program does ends this episode only
        outcome["error"] = f"{type(e).__name__}: {e}"
    outcome["seconds"] = time.monotonic() - began
