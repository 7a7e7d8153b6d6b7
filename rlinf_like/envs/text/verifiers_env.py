"""`agent.env=verifiers`: train on an environment written with Prime Intellect's `verifiers` (v1), unchanged.

A verifiers environment holds its tasks, tools and rubric, and runs each rollout itself: its harness calls the
model through an OpenAI client. Here every episode's client points at its own session of the rollout's
OpenAI-compatible endpoint, which records the exact ids and logprobs the engine sampled; training reads those,
never re-tokenized messages (`workers/rollout/agentic/openai_sessions.py`). The reward is the rubric's weighted
sum (`trace.reward`); each reward function's score is logged as `reward/<name>`.

The tasks come from the same environment: `data.source=verifiers data.name=<environment id>` with the
environment's own settings in `data.options` (`data/sources/verifiers.py`); each row names its task by index.

Failures: a rollout whose trace is not ok (the model call failed, a tool server died, a reward function
raised) is rerun in a fresh session up to `agent.env_retries` times, then its group is excluded
(`EnvironmentFailed`). An episode whose calls do not extend one another (a harness or chat template that
rewrites earlier turns) is refused by name and excluded too (`agent_program`). Tool errors the environment
shows the model ("Error executing tool ...") are part of the episode, as verifiers means them.

Runs locally: the `null` harness (plain chat with tools) in verifiers' subprocess runtime. Its chat program is a
PEP 723 script that verifiers prepares with `uv sync --script`, which downloads packages; with
`agent.verifiers.host_python` (the default) the script runs on this interpreter instead, which the
`[verifiers]` extra gives the same packages.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Any

from rlinf_like.envs.text.base import TextEnv
from rlinf_like.workers.rollout.agentic.agent_program import EnvironmentFailed

MODEL_NAME = "policy"
_LOADED: dict[tuple, tuple[Any, list]] = {}
_LOCK = threading.Lock()


def require_verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ValueError("agent.env=verifiers needs the verifiers package (the [verifiers] extra: "
                         "pip install 'verifiers==0.4.0')") from e
    # it logs every rollout's start, server and HTTP access at INFO: hundreds of lines a step; warnings still show
    for name in ("verifiers", "aiohttp.access"):
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
    return vf


def env_config(name: str, options: dict, harness: str, max_turns: int) -> dict:
    return {"taskset": {"id": name, **options},
            "agent": {"harness": {"id": harness}, "runtime": {"type": "subprocess"}, "max_turns": max_turns}}


def load(name: str, options: dict, harness: str = "null", max_turns: int = 4) -> tuple[Any, list]:
    """The environment `name` (a verifiers environment id, e.g. an installed package's module) and its tasks,
    loaded once per process. Its package directory goes on PYTHONPATH: verifiers starts tool servers as
    `python -m <module>`, and a Ray worker's path need not hold it."""
    vf = require_verifiers()
    key = (name, json.dumps(options, sort_keys=True, default=str), harness, max_turns)
    with _LOCK:
        if key not in _LOADED:
            try:
                env = vf.load_environment(vf.resolve_env_config(env_config(name, options, harness, max_turns)))
            except Exception as e:
                raise ValueError(f"data.name={name!r}: verifiers cannot load this environment with data.options="
                                 f"{options} ({type(e).__name__}: {e})") from e
            _share_package_path(type(env.taskset).__module__)
            _LOADED[key] = env, list(env.taskset)
        return _LOADED[key]


def _share_package_path(module: str) -> None:
    top = importlib.import_module(module.split(".")[0])
    root = str(Path(top.__file__).resolve().parent.parent)
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *filter(None, paths)])


def run_harness_on_this_python() -> None:
    """verifiers prepares its chat program with `uv sync --script` (a download); run it on this interpreter,
    whose packages (openai, mcp, httpx) the [verifiers] extra installs."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    async def prepare(self, script, env=None, *, activate=True):
        await self.write(".rlinf-chat-program.py", script.encode() if isinstance(script, str) else script)
        return [sys.executable, str(self.workdir / ".rlinf-chat-program.py")]

    SubprocessRuntime.prepare_uv_script = prepare


def failure(episode) -> str | None:
    """Why a verifiers episode failed, or None: its own errors, then its trace's."""
    trace = episode.traces[0] if episode.traces else None
    errors = list(episode.errors) + (list(trace.errors) if trace is not None else [])
    if episode.ok and trace is not None and trace.ok and not errors:
        return None
    if not errors:
        return f"episode not ok (stop: {getattr(trace, 'stop_condition', None)})"
    e = errors[-1]
    return f"{e.type}: {getattr(e, 'message', '') or e}"


class VerifiersEpisodes:
    """The agent program one episode runs: load (once), run the row's task against `base_url`, score it."""

    def __init__(self, harness: str, max_turns: int, temperature: float, max_tokens: int, top_p: float):
        self.harness, self.max_turns = harness, max_turns
        self.sampling = {"temperature": temperature, "max_tokens": max_tokens, "top_p": top_p}

    def __call__(self, base_url: str, row: dict[str, Any]) -> dict[str, Any]:
        vf = require_verifiers()
        env, tasks = load(row["verifiers_env"], row.get("verifiers_options") or {}, self.harness, self.max_turns)
        task = tasks[row["verifiers_task"]]
        ctx = vf.ModelContext(model=MODEL_NAME,
                              client=vf.EvalClientConfig(base_url=base_url, api_key_var="RLINF_LIKE_NO_KEY"),
                              sampling=vf.SamplingConfig(**self.sampling))
        episode = asyncio.run(env.run_episode(task, ctx))
        why = failure(episode)
        if why is not None:
            raise EnvironmentFailed(f"verifiers environment {row['verifiers_env']!r}, task {row['verifiers_task']}: "
                                    f"{why}")
        trace = episode.traces[0]
        scores = {name: r.score for name, r in trace.rewards.items() if r is not None}
        return {"reward": float(trace.reward), "scores": scores}


class VerifiersEnv(TextEnv):
    """Registered as `agent.env=verifiers`; it drives the model itself, so only `check` and `program` are used."""

    drives_model = True
    data_source = "verifiers"  # each row names the environment and its task

    @classmethod
    def check(cls, cfg) -> None:
        require_verifiers()

    @classmethod
    def program(cls, cfg, sampling) -> VerifiersEpisodes:
        if cfg.verifiers.host_python:
            run_harness_on_this_python()
        return VerifiersEpisodes(cfg.verifiers.harness, cfg.max_turns, sampling.temperature, sampling.max_new_tokens,
                                 sampling.top_p)

    def reset(self, row):
        raise NotImplementedError("agent.env=verifiers runs its own episodes (drives_model)")

    def step(self, assistant_message):
        raise NotImplementedError("agent.env=verifiers runs its own episodes (drives_model)")
