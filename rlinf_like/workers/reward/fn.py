"""Reward functions by name (`reward.fn`), and one guarded call per sample.

The signature every reward function has:

    fn(response: str, answer: str, **info) -> float | dict

`response` is the decoded response, `answer` the data row's reference answer, and `info` holds
`prompt` (the decoded prompt text), `finished` (True when the response stopped at EOS, False when it
hit the length limit) and `num_tokens` (response tokens), plus the data row's extra columns when
the data has any; accept `**info` so that new keys do not break the function. It returns the reward,
or a dict holding `"reward"` whose other numeric entries are kept per sample (`SampleScore.extras`)
and logged as metrics; `"correct"` and `"formatted"` in the dict fill those fields (else a reward of at
least `reward.correct` counts as correct).

`reward.fn` is a registered name (`math`, `exact`, `reasoning_gym`, `ifeval` or `ifeval_all`; built-ins also receive
the `reward` config as `config=`; `auto`, the default, is the data source's own: math, reasoning_gym or ifeval for
those sources) or `module:function`, imported where the rewards are computed (the reward worker), so a module on
PYTHONPATH works. Each call runs under `reward.timeout_s`; a call that raises, times out or returns something
unusable is logged with its request id and scores `reward.error_value`: one bad sample never stops the step.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import math
import numbers
import queue
import threading
from collections.abc import Callable
from typing import Any

from rlinf_like.runtime.worker_host import on_release
from rlinf_like.utils.registry import Registry
from rlinf_like.workers.reward.rules import RewardConfig
from rlinf_like.workers.reward.types import SampleScore

log = logging.getLogger(__name__)

RewardFn = Callable[..., Any]  # fn(response, answer, **info) -> float | dict
REWARD_FNS: Registry[RewardFn] = Registry("reward function", key="reward.fn")
REWARD_FNS.register("math", "rlinf_like.workers.reward.builtin:math_reward")
REWARD_FNS.register("exact", "rlinf_like.workers.reward.builtin:exact_reward")
REWARD_FNS.register("reasoning_gym", "rlinf_like.workers.reward.builtin:reasoning_gym_reward")
# IFEval's official checkers on data.source=ifeval_train rows: the share of instructions followed, or all-or-nothing
REWARD_FNS.register("ifeval", "rlinf_like.workers.reward.builtin:ifeval_reward")
REWARD_FNS.register("ifeval_all", "rlinf_like.workers.reward.builtin:ifeval_all_reward")
REWARD_FNS.register("judge", "rlinf_like.workers.reward.judge:judge_reward")  # an LLM judge's verdict (`judge.*`)
AUTO = "auto"  # the runner replaces it with the data source's reward (data/sources/); elsewhere it means math
REWARD_FNS.register(AUTO, "rlinf_like.workers.reward.builtin:math_reward")
_FIELDS = ("reward", "correct", "formatted")  # dict entries that are SampleScore fields, not extras


def needs_judge(fn: str) -> bool:
    """Whether `reward.fn=fn` reads a judge's verdicts (it declares `needs_judge`): the runner launches the judge."""
    return ":" not in fn and fn in REWARD_FNS and getattr(REWARD_FNS.get(fn), "needs_judge", False)


def load_reward_fn(config: RewardConfig) -> RewardFn:
    """The function `reward.fn` names: a built-in bound to `config`, or the user's imported function."""
    if ":" not in config.fn:
        return functools.partial(REWARD_FNS.get(config.fn), config=config)
    module, _, attr = config.fn.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except Exception as e:  # ImportError, AttributeError, or whatever the module raised while importing
        raise ValueError(f"reward.fn={config.fn!r} cannot be loaded ({type(e).__name__}: {e}); give one of "
                         f"{REWARD_FNS.names()} or module:function with the module on PYTHONPATH") from e
    if not callable(fn):
        raise ValueError(f"reward.fn={config.fn!r} is a {type(fn).__name__}, not a function")
    return fn


class _CallThread:
    """One daemon thread that runs the calls handed to it, one at a time: a step's hundreds of reward calls
    share it instead of starting a thread each (256 calls: ~0.06 s -> ~0.03 s on this CPU)."""

    def __init__(self):
        self.calls: queue.SimpleQueue = queue.SimpleQueue()
        self.abandoned = False  # a call timed out on it and may still be running
        self.thread = threading.Thread(target=self._serve, name="reward-fn", daemon=True)
        self.thread.start()
        _started.append(self)

    def _serve(self) -> None:
        while (call := self.calls.get()) is not None:
            fn, args, kwargs, outcome, done = call
            try:
                outcome["value"] = fn(*args, **kwargs)
            except BaseException as e:  # re-raised in the caller's thread
                outcome["error"] = e
            done.set()
            if self.abandoned:  # no call is handed to it again: end once the late one returns
                break
        with contextlib.suppress(ValueError):  # the release hook may have taken it off already
            _started.remove(self)


_call_threads = threading.local()  # each calling thread's own `_CallThread`
_started: list[_CallThread] = []


@on_release
def _end_idle_call_threads() -> None:
    """A kept process's next worker starts its own call threads; the idle ones end here (an abandoned one, still in
    its timed-out call, cannot, and keeps the process from being kept)."""
    for runner in list(_started):
        runner.calls.put(None)  # an abandoned one abandoned between its call's return and its check reads it next
        runner.thread.join(timeout=None if not runner.abandoned else 0.1)  # each takes itself off the list


def call_with_timeout(fn: Callable[..., Any], timeout_s: float, *args, **kwargs) -> Any:
    """`fn(*args, **kwargs)` in another thread, raising TimeoutError after `timeout_s` seconds. No
    signals: `signal.alarm` works only in the main thread, and a Ray actor's calls run in others.
    Python cannot stop a thread, so a call that times out is abandoned and runs on in the background, and
    the next call gets a fresh thread; the threads are daemons so that they never hold up the process's exit."""
    runner = getattr(_call_threads, "runner", None)
    if runner is None or not runner.thread.is_alive():
        runner = _CallThread()
    _call_threads.runner = None  # taken: a call that times out keeps its thread
    outcome: dict[str, Any] = {}
    done = threading.Event()
    runner.calls.put((fn, args, kwargs, outcome, done))
    if not done.wait(timeout_s):
        runner.abandoned = True
        raise TimeoutError(f"no result within reward.timeout_s={timeout_s}")
    _call_threads.runner = runner  # free again
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def to_sample_score(value: Any, config: RewardConfig) -> SampleScore:
    """A reward function's return value as a SampleScore; raises on a value training cannot use."""
    out = value if isinstance(value, dict) else {"reward": value}
    if "reward" not in out:
        raise ValueError(f"a reward dict must hold 'reward' (got keys {sorted(out)})")
    if not isinstance(out["reward"], numbers.Real) or not math.isfinite(out["reward"]):  # numpy floats too
        raise ValueError(f"the reward must be a finite number, got {out['reward']!r}")
    reward = float(out["reward"])
    correct = bool(out.get("correct", reward >= config.correct))
    extras = {k: float(v) for k, v in out.items() if k not in _FIELDS and isinstance(v, numbers.Real)}
    return SampleScore(reward=reward, correct=correct, formatted=bool(out.get("formatted", correct)), extras=extras)


def score_sample(fn: RewardFn, config: RewardConfig, request_id: str, response: str, answer: str,
                 **info) -> SampleScore:
    """One sample's score, never raising: a failed call is logged and scores `reward.error_value`."""
    try:
        return to_sample_score(call_with_timeout(fn, config.timeout_s, response, answer, **info), config)
    except Exception as e:
        log.warning("reward.fn=%s failed on request %s (%s: %s); the sample scores reward.error_value=%s",
                    config.fn, request_id, type(e).__name__, e, config.error_value)
        return SampleScore(reward=config.error_value, correct=False, formatted=False)
