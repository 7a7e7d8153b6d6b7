"""Rollout throughput and decode-step time: the native engine versus transformers' `generate`, same model, same
requests, same dtype.

Throughput: prompts of ragged length (8-47 tokens) x samples each, sampled at temperature 1 with EOS ignored, so
both sides produce exactly the same number of tokens. Decode-step time, for each batch size B of --step-batches:
B one-sample prompts (8-47 tokens), timed once for --step-tokens N new tokens and once for 1 (the same prompts, so
the same prefill); a step is (t_N - t_1) / (N - 1).

What keeps it fair to the baseline:
- every timed call gets prompts of its own (seeded by the measurement and the repetition), and the native engine's
  prefix cache is emptied before each timed call and checked empty (`bench.common.cold_prefix_cache`, which also
  fails the run if a call found prompt tokens in the cache or preempted), since transformers prefills every call;
- transformers is called as a user after speed would: `AutoModelForCausalLM.generate` on one left-padded batch of
  every prompt x sample, do_sample=True, temperature 1.0, top_k 0, top_p 1.0, min_new_tokens = max_new_tokens (EOS
  cannot end a row), pad_token_id set, no logits or scores returned. --hf-mode: eager (its dynamic cache), or
  static-compile (its documented fast path: a static cache, and the decode step torch.compile'd the way
  `generate` does it on GPUs), or best (the default): both timed in every repetition, and each measurement
  compared with the faster of the two (named in the output);
- both sides in this process on one thread, in --dtype (default bfloat16 where the CPU has bf16 units,
  avx512_bf16 or amx_bf16, else float32); engine start-up, compilation and a warm-up call per batch size untimed;
  at least 3 repetitions, the order of the sides reversed every other one (a, b, b, a, ...); medians.

Prints the settings, the machine (CPU model, ISA flags, load average at start and end) and each repetition. Last
line, one JSON object: ratio = native tokens/s / HF tokens/s of the medians (target >= 1.5), ratios (each
repetition's), tokens_per_s per side, hf_mode (the HF side compared with); step: per batch size, each side's median
step time in ms, ratio = HF step / native step of the medians, ratios per repetition. On a real model the step
timings at batch 128 and 256 take most of the run (--step-batches 1,32 for a shorter one).

    python bench/rollout.py --quick                  # a tiny random model written on the fly, small batches
    python bench/rollout.py                          # the tiny model: 32 prompts x 4 samples x 64 tokens
    python bench/rollout.py --model models/smollm2-135m-instruct --prompts 8 --new-tokens 32
    python bench/rollout.py --device cuda --dtype bfloat16 --prompts 64      # on a GPU (both engines on it)
    python bench/rollout.py --device cuda --dtype bfloat16 --cuda-graphs --from-config bench/configs/qwen2.5-0.5b.json \
        --prompts 64 --new-tokens 512 --hf-mode eager     # a Qwen2.5-0.5B shape, random weights, built here
    python bench/rollout.py --vs vllm --model models/smollm2-135m-instruct    # versus vLLM: bench/rollout_versus.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.common import (  # noqa: E402
    Machine,
    alternating,
    cold_prefix_cache,
    parse_batches,
    random_weights_model,
    result_line,
    seed_for,
    step_seconds,
)
from rlinf_like.models import read_hf_config  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from rlinf_like.utils.hardware import auto_precision  # noqa: E402
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine  # noqa: E402

MIN_PROMPT, MAX_PROMPT = 8, 48  # prompt lengths drawn in [MIN_PROMPT, MAX_PROMPT)
STEP_BATCHES = "1,32,128,256"
HF_MODES = ("eager", "static-compile")


def requests_for(vocab_size: int, prompts: int, samples: int, new_tokens: int, seed: int = 0) -> list[RolloutRequest]:
    """Seeded random prompts of ragged length (token ids clear of the usual special tokens); the same seed gives the
    same prompts whatever `samples` and `new_tokens` are."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    high = min(vocab_size, 1 << 15)
    lengths = [int(torch.randint(MIN_PROMPT, MAX_PROMPT, (1,), generator=gen)) for _ in range(prompts)]
    return [RolloutRequest(f"p{i}", torch.randint(4, high, (n,), generator=gen).tolist(), params, samples)
            for i, n in enumerate(lengths)]


def resolve_dtype(dtype: str, device: str) -> tuple[str, str]:
    """(dtype, why): `auto` is bfloat16 on a GPU or a CPU with bf16 units, else float32."""
    if dtype != "auto":
        return dtype, "--dtype"
    precision, why = auto_precision(torch.device(device))
    return {"bf16": "bfloat16", "fp32": "float32"}[precision], f"auto: {why}"


def random_model(config_json: str, folder: str) -> str:
    """An HF folder holding `common.random_weights_model(config_json)` in fp32."""
    random_weights_model(config_json, dtype=torch.float32).save_pretrained(folder)
    return folder


class NativeSide:
    """The native engine, each timed call on a cold prefix cache."""

    def __init__(self, path: str, dtype: str, device: str, slots: int, context: int, kv_cache_gb: float = 0.0,
                 cuda_graphs: bool = False):
        self.config = RolloutConfig(engine="native", model_path=path, max_batch_size=slots, max_context=context,
                                    dtype=dtype, kv_cache_memory_gb=kv_cache_gb, cuda_graphs=cuda_graphs)
        self.engine = make_engine(self.config, device=device)

    def describe(self) -> str:
        return (f"native engine: max_batch_size {self.config.max_batch_size}, max_context {self.config.max_context}, "
                f"prefix cache on but emptied and checked before every timed call; {self.engine.cache_plan.describe()}")

    def run(self, requests: list[RolloutRequest]) -> tuple[float, int]:
        """(seconds, tokens generated) of one generate call."""
        with cold_prefix_cache(self.engine):
            start = time.perf_counter()
            results = self.engine.generate(requests)
            seconds = time.perf_counter() - start
        return seconds, sum(len(t) for r in results for t in r.response_ids)


def load_hf_model(path: str, dtype: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()


class HFGenerate:
    """transformers' `generate` called directly, as fast as a user gets it (see the module docstring)."""

    def __init__(self, model, mode: str, context: int, device: str):
        self.model, self.mode, self.device = model, mode, torch.device(device)
        pad = model.generation_config.pad_token_id
        pad = pad if pad is not None else model.generation_config.eos_token_id
        self.pad_id = (pad[0] if isinstance(pad, list) else pad) or 0
        # set explicitly: the checkpoint's generation_config.json may carry other sampling defaults
        self.kwargs: dict = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=self.pad_id)
        if mode == "static-compile":
            from transformers.generation import CompileConfig

            compile_config = CompileConfig()  # transformers' defaults (inductor, mode "reduce-overhead")
            # generate compiles its decode step itself once the cache is static, on GPUs only unless told; prefill
            # stays eager (its shape changes every call). One cache length for every call: no recompile for it.
            compile_config._compile_all_devices = True
            self.kwargs.update(cache_implementation="static", max_cache_len=context, compile_config=compile_config)

    def describe(self) -> str:
        shown = {k: (v.to_dict() if k == "compile_config" else v) for k, v in self.kwargs.items()}
        return (f"transformers generate ({self.mode}): {shown}, min_new_tokens = max_new_tokens, left padding, "
                f"attention {self.model.config._attn_implementation}, no logits/scores returned")

    @torch.inference_mode()
    def run(self, requests: list[RolloutRequest]) -> tuple[float, int]:
        """(seconds, tokens generated) of one generate call over every prompt x sample."""
        prompts = [r.prompt_ids for r in requests for _ in range(r.n)]
        new = requests[0].sampling.max_new_tokens
        torch.manual_seed(requests[0].sampling.seed)
        start = time.perf_counter()
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                                  **self.kwargs)
        tokens = out[:, width:].cpu()  # on the host, as the native engine's lists are
        return time.perf_counter() - start, tokens.numel()


def side_name(mode: str) -> str:
    return "hf_" + mode.replace("-", "_")


def mode_of(side: str) -> str:
    return side.removeprefix("hf_").replace("_", "-")


def checked(side, requests: list[RolloutRequest], name: str) -> float:
    """One timed call's seconds, after checking it made every token asked for."""
    want = sum(r.n * r.sampling.max_new_tokens for r in requests)
    seconds, tokens = side.run(requests)
    if tokens != want:
        raise RuntimeError(f"{name} produced {tokens} tokens, not {want}")
    return seconds


def summary(values: dict[str, list[float]], native: str = "native", higher_is_better: bool = False) -> dict:
    """The baseline the native side is compared with (the best of the others' medians), the ratio of medians
    (> 1: native ahead) and each repetition's."""
    medians = {name: statistics.median(v) for name, v in values.items()}
    others = [name for name in values if name != native]
    best = (max if higher_is_better else min)(others, key=medians.get)
    if higher_is_better:
        ratios = [n / b for n, b in zip(values[native], values[best])]
        return {"baseline": best, "medians": medians, "ratio": medians[native] / medians[best], "ratios": ratios}
    ratios = [b / n for n, b in zip(values[native], values[best])]
    return {"baseline": best, "medians": medians, "ratio": medians[best] / medians[native], "ratios": ratios}


def bench(path: str, args, dtype: str) -> dict:
    vocab = read_hf_config(path)["vocab_size"]
    batches, n_step = args.step_batches, args.step_tokens
    slots = max([args.prompts * args.samples, *batches])
    context = MAX_PROMPT + max([args.new_tokens] + [n_step] * bool(batches))  # what the run needs, not the model's
    sides: dict = {"native": NativeSide(path, dtype, args.device, slots, context,
                                        cuda_graphs=getattr(args, "cuda_graphs", False))}
    model = load_hf_model(path, dtype, args.device)
    for mode in (HF_MODES if args.hf_mode == "best" else (args.hf_mode,)):
        sides[side_name(mode)] = HFGenerate(model, mode, context, args.device)
    for side in sides.values():
        print(side.describe(), flush=True)

    shapes = [(0, args.prompts, args.samples)] + [(b, b, 1) for b in batches]
    for name in list(sides):  # warm-up: allocations, first-call overheads, compilation for each batch size
        start = time.perf_counter()
        try:
            for kind, prompts, samples in shapes:
                checked(sides[name], requests_for(vocab, prompts, samples, 2, seed_for(kind, -1)), name)
        except Exception as exc:  # noqa: BLE001 - best mode goes on with eager; an explicit mode fails
            if args.hf_mode != "best" or name == "native" or name == side_name("eager"):
                raise
            print(f"{name}: dropped, its warm-up failed: {type(exc).__name__}: {exc}", flush=True)
            del sides[name]
            continue
        print(f"{name}: warm-up calls (one per batch size, compilation included) {time.perf_counter() - start:.1f} s",
              flush=True)

    def throughput(name):
        return lambda rep: checked(sides[name], requests_for(vocab, args.prompts, args.samples, args.new_tokens,
                                                             seed_for(0, rep)), name)

    tokens = args.prompts * args.samples * args.new_tokens
    times = alternating({name: throughput(name) for name in sides}, args.reps, lambda rep, t: print(
        f"rep {rep + 1}: " + ", ".join(f"{name} {tokens / s:.1f} tok/s" for name, s in t.items()), flush=True))
    rates = {name: [tokens / s for s in t] for name, t in times.items()}
    result = {"throughput": summary(rates, higher_is_better=True), "step": {}}

    def step(name, batch):
        def measure(rep):
            full = checked(sides[name], requests_for(vocab, batch, 1, n_step, seed_for(batch, rep)), name)
            one = checked(sides[name], requests_for(vocab, batch, 1, 1, seed_for(batch, rep)), name)
            return step_seconds(full, one, n_step) * 1e3
        return measure

    for batch in batches:
        steps = alternating({name: step(name, batch) for name in sides}, args.reps, lambda rep, t: print(
            f"batch {batch} rep {rep + 1}: step " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in t.items()),
            flush=True))
        result["step"][batch] = summary(steps)
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="", help="an HF folder (e.g. models/smollm2-135m-instruct); "
                                                    "default: a tiny random model of --hidden / --layers")
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (8 prompts x 4 samples x 32 tokens, step batches 1,8 of 16 tokens) and "
                             "--hf-mode eager unless given")
    parser.add_argument("--from-config", default="", help="a config.json (e.g. bench/configs/qwen2.5-0.5b.json): a "
                                                          "model of that shape with random weights, built here")
    parser.add_argument("--cuda-graphs", action="store_true", help="the native engine with rollout.cuda_graphs")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, help="default 32 (--quick: 8)")
    parser.add_argument("--samples", type=int, help="default 4")
    parser.add_argument("--new-tokens", type=int, help="default 64 (--quick: 32; --quick --vs vllm: 16)")
    parser.add_argument("--reps", type=int, default=3, help="at least 3")
    parser.add_argument("--step-batches", help=f"batch sizes of the decode-step timing, comma-separated ('none': "
                                               f"skip it); default {STEP_BATCHES} (--quick: 1,8; --quick --vs vllm: 1,4)")
    parser.add_argument("--step-tokens", type=int,
                        help="new tokens per sequence of a step timing call; default 32 (--quick: 16; --quick --vs "
                             "vllm: 8)")
    parser.add_argument("--hf-mode", choices=("eager", "static-compile", "best"), default=None,
                        help="transformers' generate: its dynamic cache (eager), a static cache with the decode step "
                             "compiled (static-compile), or both timed and the faster compared with (best; the "
                             "default, eager with --quick)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both engines on it)")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                        help="auto: bfloat16 on a GPU or a CPU with avx512_bf16 / amx_bf16, else float32")
    parser.add_argument("--vs", choices=("hf", "vllm"), default="hf", help="the engine to compare with")
    parser.add_argument("--threads", type=int, default=0, help="--vs vllm: threads per side (default: the cores)")
    parser.add_argument("--which", choices=("tiny", "real", "real-bf16", "real-bf16-bound", "real-fp32",
                                            "real-fp32-onednn", "both"),
                        default="both",
                        help="--vs vllm: the comparisons run (tiny: the tiny Qwen2, fp32; real-bf16: --model, vLLM "
                             "at its defaults; real-bf16-bound: vLLM bf16 bound to --threads cores; real-fp32: --model, "
                             "matched; real-fp32-onednn: the native side on oneDNN; real: those four; both: all), so a "
                             "long comparison can run as shorter ones")
    parser.add_argument("--vllm-python", default="", help="--vs vllm: an interpreter with vllm (default: "
                                                          "$VLLM_PYTHON, else this one)")
    args = parser.parse_args()
    # flags given win; then --quick's sizes (a smoke run: no compilation unless --hf-mode asks), then the defaults
    quick = {"prompts": 8, "new_tokens": 32, "step_batches": "1,8", "step_tokens": 16, "hf_mode": "eager"}
    if args.quick and args.vs == "vllm":
        quick.update(new_tokens=16, step_batches="1,4", step_tokens=8)
    full = {"prompts": 32, "samples": 4, "new_tokens": 64, "step_batches": STEP_BATCHES, "step_tokens": 32,
            "hf_mode": "best"}
    for key, value in full.items():
        if getattr(args, key) is None:
            setattr(args, key, quick.get(key, value) if args.quick else value)
    args.step_batches = parse_batches(args.step_batches)
    args.reps = max(args.reps, 3)
    if args.step_batches and args.step_tokens < 2:
        raise SystemExit("--step-tokens must be at least 2 (a step time is t_N - t_1 over N - 1 steps)")
    dtype, why = resolve_dtype(args.dtype, args.device)
    if args.vs == "vllm":
        from bench.common import usable_cores
        from bench.rollout_versus import versus_vllm

        args.threads = args.threads or usable_cores()
        return versus_vllm(args, dtype, why)
    torch.set_num_threads(1)
    settings = {"model": args.model or (f"random weights of {args.from_config}" if args.from_config else
                                        f"tiny random (hidden {args.hidden}, {args.layers} layers)"),
                "cuda_graphs": args.cuda_graphs,
                "prompts": args.prompts, "prompt_tokens": f"{MIN_PROMPT}-{MAX_PROMPT - 1}", "samples": args.samples,
                "new_tokens": args.new_tokens, "temperature": 1.0, "ignore_eos": True, "dtype": dtype,
                "dtype_from": why, "device": args.device, "threads": torch.get_num_threads(), "reps": args.reps,
                "hf_mode": args.hf_mode, "step_batches": args.step_batches, "step_tokens": args.step_tokens}
    if args.device.startswith("cuda"):
        settings["gpu"] = torch.cuda.get_device_name()
    machine = Machine.start(settings)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            path = args.model
        elif args.from_config:
            path = random_model(args.from_config, tmp)
        else:
            spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                                 num_layers=args.layers, num_heads=8, num_kv_heads=4, max_position_embeddings=1024)
            path = str(write_tiny_model(tmp, spec))
        result = bench(path, args, dtype)
    machine.end()
    through = result["throughput"]
    hf = through["baseline"]
    print(f"throughput (medians): native {through['medians']['native']:.1f} tokens/s, " + ", ".join(
        f"{name} {rate:.1f}" for name, rate in through["medians"].items() if name != "native")
          + f"; ratio native / {hf} {through['ratio']:.2f} (per repetition: "
          + ", ".join(f"{r:.2f}" for r in through["ratios"]) + ")")
    step = {}
    for batch, s in result["step"].items():
        medians = s["medians"]
        print(f"decode step at batch {batch} (medians): " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in
                                                                      medians.items())
              + f"; ratio {s['baseline']} / native {s['ratio']:.2f} (per repetition: "
              + ", ".join(f"{r:.2f}" for r in s["ratios"]) + ")")
        step[str(batch)] = {**{f"{name}_ms": ms for name, ms in medians.items()},
                            "hf_mode": mode_of(s["baseline"]), "ratio": s["ratio"], "ratios": s["ratios"]}
    name = (Path(args.model).name if args.model else f"{Path(args.from_config).stem} (random)" if args.from_config
            else "tiny")
    print(result_line("rollout", model=name, device=args.device,
                      dtype=dtype, threads=1, hf_mode=mode_of(hf), ratio=through["ratio"], ratios=through["ratios"],
                      tokens=args.prompts * args.samples * args.new_tokens, tokens_per_s=through["medians"],
                      step=step))


if __name__ == "__main__":
    main()
