"""One side of `bench/rollout.py --vs vllm`: an engine in its own process, timed on request.

    python bench/rollout_side.py --engine native --model PATH --threads 2 --slots 8 --context 64   # the project's venv
    /path/to/vllm/venv/bin/python bench/rollout_side.py --engine vllm --model PATH --dtype auto --threads 0 \\
        --slots 8 --context 64

Starts the engine (timed: start-up), runs one warm-up call on two prompts, then prints `@@ {"startup_s": ..,
"warmup_s": .., "dtype": ..}` (dtype: what the engine runs in; `--dtype auto` leaves vLLM's choice). Each line on
stdin, `{"prompts": P, "samples": S, "new_tokens": N, "seed": s}`, generates `bench.rollout.requests_for(...)` of
those once and prints `@@ {"seconds": .., "tokens": ..}`; end of input ends it. Only `@@ ` lines are the protocol
(vLLM logs to both streams). Idle between runs, so the other side's timings run alone.

Every timed call starts cold: the native engine's prefix cache is emptied and checked (`bench.common.
cold_prefix_cache`), vLLM's reset (`LLM.reset_prefix_cache`); each call's prompts are new anyway.

Threads: the native engine calls torch.set_num_threads(threads) (0: torch's default). vLLM with --threads N binds
its OpenMP threads to the first N cores (VLLM_CPU_OMP_THREADS_BIND, set before vLLM is imported); with --threads 0
vLLM binds as it does by default ("auto": on a 2-core host it computes on one core and keeps the other for its
scheduler process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# both sides: 2 GiB of KV cache. vLLM's CPU blocks hold 128 tokens, so 256 sequences of <= 128 tokens take 256
# blocks: 1.5 GB at SmolLM2's 46 KiB per token in float32
KV_CACHE_BYTES = 2 << 30


def say(**fields) -> None:
    print("@@ " + json.dumps(fields), flush=True)


def native_side(args):
    import torch

    from bench.common import cold_prefix_cache
    from rlinf_like.workers.rollout import RolloutConfig, make_engine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = make_engine(RolloutConfig(engine="native", model_path=args.model, max_batch_size=args.slots,
                                       max_context=args.context, dtype=args.dtype, fp32_kernels=args.fp32_kernels,
                                       kv_cache_memory_gb=KV_CACHE_BYTES / 2**30))

    def generate(reqs) -> tuple[float, int]:
        with cold_prefix_cache(engine):
            start = time.perf_counter()
            results = engine.generate(reqs)
            seconds = time.perf_counter() - start
        return seconds, sum(len(t) for r in results for t in r.response_ids)
    return generate, args.dtype


def vllm_side(args):
    if args.threads:
        cores = sorted(os.sched_getaffinity(0))[: args.threads]
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    import vllm

    # vLLM's defaults otherwise (torch.compile'd model, prefix caching, its multiprocess engine core); the
    # settings that differ from them are what both sides must share: batch, context, KV cache, one seed (and
    # dtype, unless --dtype auto)
    # --eager (the bench's --quick only): no torch.compile, start-up ~32 s instead of ~80 s on the tiny model
    dtype = {} if args.dtype == "auto" else {"dtype": args.dtype}
    llm = vllm.LLM(model=args.model, seed=0, max_model_len=args.context, max_num_seqs=args.slots,
                   kv_cache_memory_bytes=KV_CACHE_BYTES, enforce_eager=args.eager, **dtype)

    def generate(reqs) -> tuple[float, int]:
        llm.reset_prefix_cache()
        s = reqs[0].sampling
        params = vllm.SamplingParams(n=reqs[0].n, temperature=s.temperature, max_tokens=s.max_new_tokens,
                                     ignore_eos=True, detokenize=False)  # token ids in and out, as ours
        prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        seconds = time.perf_counter() - start
        return seconds, sum(len(c.token_ids) for o in outs for c in o.outputs)
    running = getattr(getattr(llm.llm_engine, "model_config", None), "dtype", "unknown")
    return generate, str(running).removeprefix("torch.")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=("native", "vllm"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=0, help="0: the engine's own choice")
    p.add_argument("--slots", type=int, required=True, help="sequences decoded together at most")
    p.add_argument("--context", type=int, required=True, help="prompt + new tokens at most")
    p.add_argument("--dtype", default="float32", help="vllm: auto = its default")
    p.add_argument("--fp32-kernels", default="exact", choices=("exact", "onednn"), help="native: rollout.fp32_kernels")
    p.add_argument("--eager", action="store_true",
                   help="vllm: enforce_eager (a smoke run's start-up, not vLLM's default)")
    args = p.parse_args()
    from bench.rollout import requests_for
    from rlinf_like.models import read_hf_config

    vocab = read_hf_config(args.model)["vocab_size"]
    start = time.perf_counter()
    generate, dtype = (native_side if args.engine == "native" else vllm_side)(args)
    startup = time.perf_counter() - start
    start = time.perf_counter()
    generate(requests_for(vocab, 2, 1, 2, seed=0))
    say(startup_s=startup, warmup_s=time.perf_counter() - start, dtype=dtype)
    for line in sys.stdin:
        if not line.strip():
            continue
        ask = json.loads(line)
        seconds, tokens = generate(requests_for(vocab, ask["prompts"], ask["samples"], ask["new_tokens"],
                                                seed=ask["seed"]))
        say(seconds=seconds, tokens=tokens)


if __name__ == "__main__":
    main()
