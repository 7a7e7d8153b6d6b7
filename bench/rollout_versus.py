"""`bench/rollout.py --vs vllm`: the native engine versus vLLM, same requests, on the tiny Qwen2 model and a real one.

Each engine runs in its own process (`bench/rollout_side.py`): the native one under this interpreter, vLLM under the
interpreter that has it (`--vllm-python`, else $VLLM_PYTHON, else this one), since vLLM often lives in a venv of its
own. Both processes start first (start-up and a warm-up call reported apart), then one untimed call per batch size
each, then the timed calls alternate (native, vLLM, vLLM, native, ...), the idle side stopped (SIGSTOP to its
process group). Every timed call has prompts of its own and a cold prefix cache on both sides.

The comparisons (`--which`):
- tiny: the tiny Qwen2 (hidden 256, head dim 64), float32 on both, --threads on both (`ratio_tiny`);
- real-bf16: --model with vLLM at its defaults: its dtype (bfloat16 for SmolLM2's float32 checkpoint on a CPU with
  bf16 units; the one it ran is printed and in the JSON) and its own thread binding (neither
  VLLM_CPU_OMP_THREADS_BIND nor OMP_NUM_THREADS set); the native side in --dtype (auto: bfloat16 where the CPU
  has bf16 units) on --threads (`ratio_real_bf16`);
- real-bf16-bound: as real-bf16, but vLLM bound to --threads cores as in real-fp32 (`ratio_real_bf16_bound`): on a
  2-core Zen 4 host vLLM ran faster bound than at its defaults, so its best bf16 is the faster of the two;
- real-fp32: --model, float32 and --threads on both (`ratio_real_fp32`), the native engine on its exact kernels;
- real-fp32-onednn: as real-fp32 with the native engine on `rollout.fp32_kernels=onednn` (`ratio_real_fp32_onednn`),
  the comparison for a host without bf16 units.
Both sides share the batch (max_num_seqs), the context, a 2 GiB KV cache and one seed; vLLM keeps its other
defaults (torch.compile, prefix caching, chunked prefill, its multiprocess engine core).

Each comparison times throughput (prompts x samples x new tokens, as bench/rollout.py) and, for each of
--step-batches, the decode step: (t_N - t_1) / (N - 1) over the same prompts. Last line: {"bench":
"rollout_vs_vllm", "ratio_tiny", "ratio_real_bf16", "ratio_real_fp32": native tokens/s over vLLM's of the medians,
"ratios_*": per repetition, "step": per comparison and batch size, medians in ms, ratio vLLM / native, per
repetition}.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Machine, alternating, result_line, seed_for, step_seconds

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

    def __init__(self, python: str, engine: str, model: str, threads: int, dtype: str, slots: int, context: int,
                 eager: bool = False, fp32_kernels: str = "exact"):
        cmd = [python, str(SIDE), "--engine", engine, "--model", model, "--threads", str(threads), "--dtype", dtype,
               "--slots", str(slots), "--context", str(context), *(["--eager"] * eager)]
        if engine == "native":
            cmd += ["--fp32-kernels", fp32_kernels]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        else:  # the engine's own choice, as a user who sets nothing gets it
            env.pop("OMP_NUM_THREADS", None)
            env.pop("VLLM_CPU_OMP_THREADS_BIND", None)
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

    def run(self, prompts: int, samples: int, new_tokens: int, seed: int) -> float:
        """Seconds of one generate call of `requests_for(prompts, samples, new_tokens, seed)`, its tokens checked."""
        self.resume()
        try:
            self.proc.stdin.write(json.dumps({"prompts": prompts, "samples": samples, "new_tokens": new_tokens,
                                              "seed": seed}) + "\n")
            self.proc.stdin.flush()
            out = self._reply()
        finally:
            self.pause()
        if out["tokens"] != prompts * samples * new_tokens:
            raise RuntimeError(f"{self.engine} produced {out['tokens']} tokens, not {prompts * samples * new_tokens}")
        return out["seconds"]

    def close(self) -> None:
        self.resume()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its whole group: vLLM's engine core outlived its parent


def compare(label: str, model: str, args, python: str, native_dtype: str, vllm_dtype: str, vllm_threads: int,
            fp32_kernels: str = "exact") -> dict:
    """One comparison: throughput and decode-step summaries (bench.rollout.summary), and the dtypes that ran."""
    from bench.rollout import MAX_PROMPT, summary

    batches, n_step = args.step_batches, args.step_tokens
    slots = max([args.prompts * args.samples, *batches])
    context = MAX_PROMPT + max([args.new_tokens] + [n_step] * bool(batches))
    tokens = args.prompts * args.samples * args.new_tokens
    sides: dict[str, Side] = {}
    try:
        for engine, exe, dtype, threads in (("native", sys.executable, native_dtype, args.threads),
                                            ("vllm", python, vllm_dtype, vllm_threads)):
            sides[engine] = Side(exe, engine, model, threads, dtype, slots, context,
                                 eager=args.quick and engine == "vllm", fp32_kernels=fp32_kernels)
            print(f"{label}: {engine} ({sides[engine].ready['dtype']}, threads {threads or 'its default'}) start-up "
                  f"{sides[engine].ready['startup_s']:.1f} s, warm-up call {sides[engine].ready['warmup_s']:.1f} s",
                  flush=True)
        for engine, side in sides.items():  # untimed: first-call costs of each batch size (vLLM compiles per size)
            start = time.perf_counter()
            for kind, prompts, samples in [(0, args.prompts, args.samples)] + [(b, b, 1) for b in batches]:
                side.run(prompts, samples, 2, seed_for(kind, -1))
            print(f"{label}: {engine} warm-up calls (one per batch size) {time.perf_counter() - start:.1f} s",
                  flush=True)

        def throughput(engine):
            return lambda rep: tokens / sides[engine].run(args.prompts, args.samples, args.new_tokens,
                                                          seed_for(0, rep))

        rates = alternating({engine: throughput(engine) for engine in sides}, args.reps, lambda rep, r: print(
            f"{label} rep {rep + 1}: native {r['native']:.1f} tok/s, vLLM {r['vllm']:.1f} tok/s", flush=True))

        def step(engine, batch):
            def measure(rep):
                full = sides[engine].run(batch, 1, n_step, seed_for(batch, rep))
                one = sides[engine].run(batch, 1, 1, seed_for(batch, rep))
                return step_seconds(full, one, n_step) * 1e3
            return measure

        steps = {}
        for batch in batches:
            steps[batch] = summary(alternating({engine: step(engine, batch) for engine in sides}, args.reps,
                                               lambda rep, ms: print(f"{label} batch {batch} rep {rep + 1}: step "
                                                                     f"native {ms['native']:.2f} ms, vLLM "
                                                                     f"{ms['vllm']:.2f} ms", flush=True)))
    finally:
        for side in sides.values():
            side.close()
    through = summary(rates, higher_is_better=True)
    med = through["medians"]
    print(f"{label}: native {med['native']:.1f} tok/s, vLLM {med['vllm']:.1f} tok/s (medians), ratio "
          f"{through['ratio']:.2f} (per repetition: {', '.join(f'{r:.2f}' for r in through['ratios'])})", flush=True)
    for batch, s in steps.items():
        print(f"{label}: decode step at batch {batch}: native {s['medians']['native']:.2f} ms, vLLM "
              f"{s['medians']['vllm']:.2f} ms (medians), ratio vLLM / native {s['ratio']:.2f} (per repetition: "
              f"{', '.join(f'{r:.2f}' for r in s['ratios'])})", flush=True)
    return {"ratio": through["ratio"], "ratios": through["ratios"], "tokens_per_s": med,
            "dtypes": {engine: side.ready["dtype"] for engine, side in sides.items()},
            "step": {str(b): {"native_ms": s["medians"]["native"], "vllm_ms": s["medians"]["vllm"],
                              "ratio": s["ratio"], "ratios": s["ratios"]} for b, s in steps.items()}}


def versus_vllm(args, native_dtype: str, dtype_from: str) -> None:
    python = vllm_python(args.vllm_python)
    # a time limit's SIGTERM ends the run through the `finally`s: the stopped (SIGSTOP) sides are resumed and closed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    why = missing_vllm(python)
    if why:
        raise SystemExit(f"bench/rollout.py --vs vllm: {why}")
    from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

    which = getattr(args, "which", "both")
    real = ["real-bf16", "real-bf16-bound", "real-fp32", "real-fp32-onednn"]
    runs = {"tiny": ["tiny"], "real": real, "both": ["tiny", *real]}.get(which, [which])
    if any(r.startswith("real") for r in runs) and not args.model:
        if which != "both":
            raise SystemExit(f"bench/rollout.py --vs vllm --which {which} needs --model PATH")
        runs = ["tiny"]
    machine = Machine.start({
        "prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens, "temperature": 1.0,
        "ignore_eos": True, "reps": args.reps, "step_batches": args.step_batches, "step_tokens": args.step_tokens,
        "comparisons": runs, "threads": args.threads,
        "tiny": "float32 both, threads both",
        "real-bf16": f"native {native_dtype} ({dtype_from}), {args.threads} threads; vLLM its default dtype and "
                     "thread binding",
        "real-bf16-bound": f"native {native_dtype}, vLLM bfloat16, {args.threads} threads both (vLLM bound to the "
                           "first cores)",
        "real-fp32": f"float32 both, {args.threads} threads both (VLLM_CPU_OMP_THREADS_BIND to the first cores)",
        "real-fp32-onednn": "as real-fp32, the native engine with rollout.fp32_kernels=onednn",
        "kv_cache_bytes": "2 GiB both", "vllm_python": python, "real_model": args.model,
        "vllm_enforce_eager": bool(args.quick)})
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for run in runs:
            if run == "tiny":
                # head_dim 64: what vLLM's CPU attention supports
                spec = TinyModelSpec(arch="qwen2", hidden_size=256, intermediate_size=704, num_layers=4, num_heads=4,
                                     num_kv_heads=2, max_position_embeddings=1024)
                results["tiny"] = compare("tiny qwen2", str(write_tiny_model(tmp, spec)), args, python, "float32",
                                          "float32", args.threads)
            elif run == "real-bf16":
                results["real_bf16"] = compare(f"{Path(args.model).name} (vLLM defaults)", args.model, args, python,
                                               native_dtype, "auto", 0)
            elif run == "real-bf16-bound":
                results["real_bf16_bound"] = compare(f"{Path(args.model).name} (bf16, vLLM bound)", args.model, args,
                                                     python, native_dtype, "bfloat16", args.threads)
            elif run == "real-fp32":
                results["real_fp32"] = compare(f"{Path(args.model).name} (float32, matched)", args.model, args,
                                               python, "float32", "float32", args.threads)
            else:
                results["real_fp32_onednn"] = compare(f"{Path(args.model).name} (float32, native oneDNN)", args.model,
                                                      args, python, "float32", "float32", args.threads, "onednn")
    machine.end()
    fields = {}
    for key, r in results.items():
        fields[f"ratio_{key}"], fields[f"ratios_{key}"] = r["ratio"], r["ratios"]
    print(result_line("rollout_vs_vllm", **fields, threads=args.threads,
                      dtypes={key: r["dtypes"] for key, r in results.items()},
                      tokens_per_s={key: r["tokens_per_s"] for key, r in results.items()},
                      step={key: r["step"] for key, r in results.items()}))
