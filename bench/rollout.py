"""Rollout throughput: the native engine versus transformers' `generate`, same model, same requests.

Prompts of ragged length x samples each, sampled at temperature 1 with EOS ignored, so both engines
produce exactly the same number of tokens. Both run in this process on one thread; engine start-up and a
warm-up call are outside the timings; repetitions alternate which side goes first (native, hf, hf,
native, ...), so a drift in the machine's load hits both alike. Prints the settings, the machine and its
load average before and after; last line: one JSON object, ratio = native tokens/s / HF tokens/s of the
medians (target >= 1.5), and the ratio of each repetition.

    python bench/rollout.py [--quick]                      # a tiny random model written on the fly
    python bench/rollout.py --model models/smollm2-135m-instruct --prompts 8 --new-tokens 32
    python bench/rollout.py --device cuda --dtype bfloat16 --prompts 64      # on a GPU (both engines on it)
    python bench/rollout.py --vs vllm --model models/smollm2-135m-instruct    # versus vLLM: bench/rollout_versus.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from rlinf_like.models import read_hf_config  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine  # noqa: E402

MIN_PROMPT, MAX_PROMPT = 8, 48  # prompt lengths drawn in [MIN_PROMPT, MAX_PROMPT)


def requests_for(vocab_size: int, prompts: int, samples: int, new_tokens: int) -> list[RolloutRequest]:
    """Seeded random prompts of ragged length (token ids clear of the usual special tokens)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
    gen = torch.Generator().manual_seed(0)
    high = min(vocab_size, 1 << 15)
    return [RolloutRequest(f"p{i}", torch.randint(4, high, (int(torch.randint(MIN_PROMPT, MAX_PROMPT, (1,), generator=gen)),),
                                                  generator=gen).tolist(), params, samples)
            for i in range(prompts)]


def machine(device: str) -> str:
    gpu = f", {torch.cuda.get_device_name()}" if device.startswith("cuda") else ""
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs{gpu}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread")


def load() -> str:
    return "load average " + " / ".join(f"{x:.2f}" for x in os.getloadavg())


def bench(path: str, prompts: int, samples: int, new_tokens: int, reps: int, device: str = "cpu",
          dtype: str = "float32") -> tuple[dict, list[float], int]:
    """Tokens/s per engine (medians) and each repetition's native/HF ratio."""
    requests = requests_for(read_hf_config(path)["vocab_size"], prompts, samples, new_tokens)
    context = MAX_PROMPT + new_tokens  # what the run needs, not the model's context (8192 for SmolLM2)
    engines = {"native": make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=prompts * samples,
                                                   max_context=context, dtype=dtype), device=device),
               "hf": make_engine(RolloutConfig(engine="hf", model_path=path, max_context=context, dtype=dtype),
                                 device=device)}
    tokens = prompts * samples * new_tokens
    for engine in engines.values():  # warm-up (allocations, first-call overheads)
        engine.generate(requests[:2])
    times: dict[str, list[float]] = {name: [] for name in engines}
    for rep in range(reps):
        order = list(engines) if rep % 2 == 0 else list(engines)[::-1]
        for name in order:
            start = time.perf_counter()
            results = engines[name].generate(requests)
            times[name].append(time.perf_counter() - start)
            produced = sum(len(t) for r in results for t in r.response_ids)
            assert produced == tokens, (name, produced)
    rate = {name: tokens / statistics.median(t) for name, t in times.items()}
    per_rep = [hf_s / native_s for native_s, hf_s in zip(times["native"], times["hf"])]
    return rate, per_rep, tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="", help="an HF folder (e.g. models/smollm2-135m-instruct); "
                                                    "default: a tiny random model of --hidden / --layers")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both engines on it)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--vs", choices=("hf", "vllm"), default="hf", help="the engine to compare with")
    parser.add_argument("--threads", type=int, default=0, help="--vs vllm: threads per side (default: the cores)")
    parser.add_argument("--which", choices=("tiny", "real", "both"), default="both",
                        help="--vs vllm: the models compared (real: --model; tiny: the tiny Qwen2), so a long "
                             "comparison can run as two shorter ones")
    parser.add_argument("--vllm-python", default="", help="--vs vllm: an interpreter with vllm (default: "
                                                          "$VLLM_PYTHON, else this one)")
    args = parser.parse_args()
    if args.vs == "vllm":
        from bench.common import usable_cores
        from bench.rollout_versus import versus_vllm

        args.threads = args.threads or usable_cores()
        if args.quick:
            args.prompts, args.samples, args.new_tokens, args.reps = 8, 4, 16, 1
        else:
            args.reps = max(args.reps, 3)
        return versus_vllm(args)
    torch.set_num_threads(1)
    prompts, samples, new_tokens, reps = ((8, 4, 32, 1) if args.quick
                                          else (args.prompts, args.samples, args.new_tokens, max(args.reps, 3)))
    print(f"machine: {machine(args.device)}; {load()}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            path, what = args.model, f"model {Path(args.model).name}"
        else:
            spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                                 num_layers=args.layers, num_heads=8, num_kv_heads=4, max_position_embeddings=1024)
            path, what = str(write_tiny_model(tmp, spec)), f"tiny model, {spec.num_layers} layers, hidden {spec.hidden_size}"
        rate, per_rep, tokens = bench(path, prompts, samples, new_tokens, reps, args.device, args.dtype)
    ratio = rate["native"] / rate["hf"]
    print(f"{what}: {prompts} prompts of {MIN_PROMPT}-{MAX_PROMPT - 1} tokens x {samples} samples x {new_tokens} new "
          f"tokens, temperature 1, EOS ignored, one thread, {args.device} {args.dtype}, {reps} alternating repetitions; "
          f"{load()}")
    print(f"native {rate['native']:.1f} tokens/s   transformers generate {rate['hf']:.1f} tokens/s   ratio {ratio:.2f} "
          f"(per repetition: {', '.join(f'{r:.2f}' for r in per_rep)})")
    print(json.dumps({"bench": "rollout", "model": Path(args.model).name if args.model else "tiny", "device": args.device,
                      "ratio": round(ratio, 3), "ratios": [round(r, 3) for r in per_rep], "tokens": tokens}))


if __name__ == "__main__":
    main()
