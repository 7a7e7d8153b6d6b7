"""An OpenEnv environment as a text environment (`agent.env=openenv`, the `[openenv]` extra).

An OpenEnv environment is a server with `reset` / `step` over a WebSocket session and a typed client. Each
episode opens its own session: the reset's observation becomes the user's opening message, each model turn goes
back as the action's text field (`agent.openenv.action_field`), and each observation that does not end the
episode becomes the next user message, rendered through the chat template by the rollout (the model's own
tokens are never re-tokenized). The observation's rewards are the episode's environment reward.

The server is `agent.openenv.base_url`, or `agent.openenv.app` ("module:app", a FastAPI app made with
openenv-core's `create_fastapi_app`), which each rollout process serves itself with uvicorn as a real process
on a free local port, stopped when the process exits. A failing server (it raised, timed out, or died) fails the
episode; the rollout's retry and exclusion policy takes it from there (`agent.env_retries`).
"""

from __future__ import annotations

import atexit
import ctypes
import importlib
import importlib.util
import json
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from rlinf_like.envs.text.base import Message, TextEnv, TextStep
from rlinf_like.utils.extras import require

_SERVERS: dict[str, tuple[subprocess.Popen, str]] = {}  # app -> (its process, its base URL), one per process
_LOCK = threading.Lock()


class OpenEnvText(TextEnv):
    def __init__(self, base_url: str, action_field: str = "message", observation_field: str = "message",
                 system_prompt: str = "", message_timeout_s: float = 60.0, reset_keys: tuple[str, ...] = ()):
        client = require("openenv.core").GenericEnvClient(base_url=base_url, message_timeout_s=message_timeout_s)
        self.client, self.base_url = client.sync(), base_url
        self.action_field, self.observation_field = action_field, observation_field
        self.system_prompt, self.reset_keys = system_prompt, reset_keys

    @classmethod
    def check(cls, cfg) -> None:
        require("openenv.core")  # missing: names the [openenv] extra
        o = cfg.openenv
        if bool(o.base_url) == bool(o.app):
            raise ValueError(f"agent.env=openenv needs exactly one of agent.openenv.base_url (a running server) and "
                             f"agent.openenv.app (module:app, served by the run); got base_url={o.base_url!r}, "
                             f"app={o.app!r}")
        if o.app:
            module, _, name = o.app.partition(":")
            if not name or not hasattr(importlib.import_module(module), name):
                raise ValueError(f"agent.openenv.app={o.app!r}: module {module!r} has no {name!r} (module:app)")

    @classmethod
    def from_config(cls, cfg, system_prompt: str = "") -> OpenEnvText:
        o = cfg.openenv
        base_url = o.base_url or serve(o.app, o.startup_timeout_s)
        return cls(base_url, o.action_field, o.observation_field, system_prompt, cfg.env_timeout_s,
                   tuple(o.reset_keys))

    def render(self, observation: dict[str, Any]) -> str:
        """The observation as the user's message: its text field, or the whole observation as JSON."""
        if self.observation_field in observation:
            return str(observation[self.observation_field])
        return json.dumps(observation, sort_keys=True, default=str)

    def reset(self, row: dict[str, Any]) -> list[Message]:
        result = self.client.reset(**{key: row[key] for key in self.reset_keys if key in row})
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return opening + [{"role": "user", "content": self.render(result.observation)}]

    def step(self, assistant_message: str) -> TextStep:
        result = self.client.step({self.action_field: assistant_message})
        reward = float(result.reward or 0.0)
        if result.done:
            return TextStep(None, reward=reward, done=True, end_reason="answer")
        return TextStep([{"role": "user", "content": self.render(result.observation)}], reward=reward)

    def close(self) -> None:
        self.client.close()


def die_with_parent() -> None:
    """In the server's process before exec: on Linux, take SIGTERM when the process that started it dies. A Ray
    worker is killed without running its exit handlers, and its server must not outlive it. The signal follows the
    thread that started the server: one started from a thread that has ended is gone, and `serve` starts another."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app: str, startup_timeout_s: float = 60.0) -> str:
    """The base URL of `app` ("module:app") served by uvicorn in a process of its own, started on first use in this
    process and stopped when it exits. A server that dies or does not answer in time is refused, naming the app."""
    if not app:
        raise ValueError("agent.env=openenv needs agent.openenv.base_url (a running server) or agent.openenv.app "
                         "(module:app, served by the run)")
    with _LOCK:
        if app in _SERVERS and _SERVERS[app][0].poll() is None:
            return _SERVERS[app][1]
        port = free_port()
        # its log to a file: a pipe nobody reads would fill up and stall the server
        log = tempfile.NamedTemporaryFile(prefix="openenv-server-", suffix=".log", delete=False)
        process = subprocess.Popen([sys.executable, "-m", "uvicorn", app, "--app-dir", app_dir(app), "--host",
                                    "127.0.0.1", "--port", str(port), "--log-level", "warning"],
                                   stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent)
        atexit.register(stop, process)
        base_url = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, base_url, app, startup_timeout_s, log.name)
        _SERVERS[app] = (process, base_url)
        return base_url


def app_dir(app: str) -> str:
    """The folder from which `app`'s module imports as this process imports it (a Ray worker's working directory
    need not be the driver's, whose path the worker imports from)."""
    module = app.partition(":")[0]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"agent.openenv.app={app!r}: module {module!r} is not importable here")
    path = Path(spec.origin).resolve()
    if path.name == "__init__.py":
        path = path.parent
    for _ in module.split("."):
        path = path.parent
    return str(path)


def wait_until_healthy(process: subprocess.Popen, base_url: str, app: str, timeout_s: float, log: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            err = Path(log).read_text(errors="replace")[-2000:]
            raise RuntimeError(f"agent.openenv.app={app!r}: the server exited with {process.returncode}:\n{err}")
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    stop(process)
    raise TimeoutError(f"agent.openenv.app={app!r}: no answer from {base_url}/health within "
                       f"agent.openenv.startup_timeout_s={timeout_s}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
