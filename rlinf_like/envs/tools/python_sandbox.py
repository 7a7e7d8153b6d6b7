"""The `python` tool: runs the model's code in a separate, limited interpreter.

Limits: a wall-clock timeout (the whole process group is killed), CPU time, address space, file size, no new
processes (RLIMIT_NPROC; not enforced for root), no inherited environment (no tokens or cloud keys), a temporary
working directory removed after the call. The limits are set by a bootstrap inside the child before the model's
code runs, not in a `preexec_fn`, which can deadlock when the parent has threads (a Ray worker does).

Not a security boundary against a determined attacker: the code runs as the same user and can read what that user
can (files, /proc); use a container for untrusted code at scale.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from rlinf_like.envs.tools.base import Tool, ToolError, ToolTimeout

FILE_LIMIT_BYTES = 1 << 20  # any file the code writes, its output included: a flood stops here, fast
# runs in the child: limits first (soft = hard, so the code cannot raise them), then the code as __main__
_BOOTSTRAP = """\
import resource, sys, traceback
cpu_s, memory_bytes, file_bytes = (int(v) for v in sys.argv[1:4])
for limit, (soft, hard) in ((resource.RLIMIT_CPU, (cpu_s, cpu_s + 1)), (resource.RLIMIT_AS, (memory_bytes,) * 2),
                            (resource.RLIMIT_FSIZE, (file_bytes,) * 2), (resource.RLIMIT_CORE, (0, 0)),
                            (resource.RLIMIT_NPROC, (0, 0))):
    resource.setrlimit(limit, (soft, hard))
sys.argv = ["main.py"]
with open("main.py", encoding="utf-8") as f:
    source = f.read()
try:
    exec(compile(source, "main.py", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
except SystemExit:
    raise
except BaseException as exc:  # the traceback without this bootstrap's frame
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
"""


def minimal_env(workdir: str) -> dict[str, str]:
    """The child's whole environment: nothing of the parent's (HF_TOKEN, AWS_*, ... stay out)."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class PythonTool(Tool):
    name = "python"
    description = ("Run a Python 3 program and return what it prints (stdout and stderr). Each call starts a fresh "
                   "interpreter: no state is kept between calls. Use print() to see values.")
    parameters = {"type": "object",
                  "properties": {"code": {"type": "string", "description": "the Python source to run"}},
                  "required": ["code"]}

    def run(self, arguments: dict[str, Any]) -> str:
        code = self.string_argument(arguments, "code")
        opts = self.options
        with tempfile.TemporaryDirectory(prefix="rlinf-python-") as tmp:
            workdir, output_path = Path(tmp) / "work", Path(tmp) / "output.txt"
            workdir.mkdir()
            (workdir / "main.py").write_text(code, encoding="utf-8")
            limits = [str(opts.python_cpu_s), str(opts.python_memory_mb << 20), str(FILE_LIMIT_BYTES)]
            with open(output_path, "wb") as output:  # a file, not a pipe: the child cannot fill our memory
                proc = subprocess.Popen([sys.executable, "-I", "-u", "-X", "utf8", "-c", _BOOTSTRAP, *limits],
                                        cwd=workdir, env=minimal_env(str(workdir)), stdin=subprocess.DEVNULL,
                                        stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    returncode = proc.wait(timeout=opts.timeout_s)
                except subprocess.TimeoutExpired:
                    returncode = None
                finally:  # also reaps what the code started in the background
                    _kill_group(proc.pid)
                    proc.wait()
            head, tail, total_bytes = _read_ends(output_path, 4 * opts.max_output_chars + 4)  # bytes for as many chars
        return self._result(returncode, head, tail, total_bytes)

    def _result(self, returncode: int | None, head: str, tail: str, total_bytes: int) -> str:
        """What the model sees: how the run ended, then the output, its middle cut (a traceback ends with the
        error) to fit `max_output_chars`, with a note."""
        opts = self.options
        if returncode is None:
            header, error = f"the code timed out after {opts.timeout_s:g} s and was stopped", ToolTimeout
        elif returncode == 0:
            header, error = "", None
        elif returncode == -signal.SIGXCPU:
            header, error = f"the code used its CPU time limit of {opts.python_cpu_s} s and was stopped", ToolError
        elif returncode < 0:
            header, error = f"the code was killed by {signal.Signals(-returncode).name}", ToolError
        else:
            header, error = f"the code exited with status {returncode}", ToolError
        output = head + tail  # tail: the file's end when the file is longer than what was read of its start
        if error is not None and "MemoryError" in output[-300:]:
            header += f" (memory limit: {opts.python_memory_mb} MB)"
        if header and output:
            header += "; its output:\n"
        text = header + output
        if tail or len(text) > opts.max_output_chars:
            budget = max(opts.max_output_chars - len(header), 0)
            stopped = "; the output limit, the program was stopped there" if total_bytes >= FILE_LIMIT_BYTES else ""
            note = f"\n... [truncated: {total_bytes} bytes of output in all{stopped}; its middle is cut] ...\n"
            text = header + output[:budget // 2] + note + output[len(output) - (budget - budget // 2):]
        if error is not None:
            raise error(text)
        return text if text else "(no output: print() the values you want to see)"


def _read_ends(path: Path, max_bytes: int) -> tuple[str, str, int]:
    """At most `max_bytes` of the file's start and as many of its end (empty when the start holds it all),
    decoded, and the file's size: a flood of output is never read whole."""
    with open(path, "rb") as f:
        total = os.fstat(f.fileno()).st_size
        head = f.read(max_bytes)
        if total <= max_bytes:
            return head.decode("utf-8", errors="replace"), "", total
        f.seek(max(total - max_bytes, max_bytes))
        return head.decode("utf-8", errors="replace"), f.read(max_bytes).decode("utf-8", errors="replace"), total


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already gone
        pass
