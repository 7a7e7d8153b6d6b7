"""One side of `bench/rollout.py --vs vllm`: an engine in its own process, timed on request.

    python bench/rollout_side.py --engine native --model PATH --threads 2      # the project's venv
    /path/to/vllm/venv/bin/python bench/rollout_side.py --engine vllm --model PATH --threads 2

Starts the engine (timed: start-up), runs one warm-up call on two prompts, then prints `@@ {"startup_s": ..}`; each
line "run" on stdin generates the bench's requests once and prints `@@ {"seconds": .., "tokens": ..}`; end of input
ends it. Only `@@ ` lines are the protocol (vLLM logs to both streams). Idle between runs, so the other side's
timings run alone.

Threads: the native engine calls torch.set_num_threads(threads); vLLM's CPU worker binds its OpenMP threads to the
first `threads` cores (VLLM_CPU_OMP_THREADS_BIND, set before vLLM is imported; vLLM's default, "auto", keeps one
core of two for its scheduler process and computes on the other).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KV_CACHE_BYTES = 1 << 30  # both sides: 1 GiB of KV cache (far more than 128 sequences of 112 tokens need)


def say(**fields) -> None:
    print("@@ " + json.dumps(fields), flush=True)


def native_side(args, requests):
    import torch

    from rlinf_like.workers.rollout import RolloutConfig, make_engine

    torch.set_num_threads(args.threads)
    engine = make_engine(RolloutConfig(engine="native", model_path=args.model, max_batch_size=args.prompts * args.samples,
                                       max_context=args.context, dtype=args.dtype,
                                       kv_cache_memory_gb=KV_CACHE_BYTES / 2**30))

    def generate(reqs) -> int:
        return sum(len(t) for r in engine.generate(reqs) for t in r.response_ids)
    return generate


def vllm_side(args, requests):
    cores = sorted(os.sched_getaffinity(0))[: args.threads]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(map(str, cores)))
    import vllm

    # vLLM's defaults otherwise (torch.compile'd model, prefix caching, its multiprocess engine core); the
    # settings that differ from them are what both sides must share: dtype, batch, context, KV cache, one seed
    # --eager (the bench's --quick only): no torch.compile, start-up ~32 s instead of ~80 s on the tiny model
    llm = vllm.LLM(model=args.model, dtype=args.dtype, seed=0, max_model_len=args.context,
                   max_num_seqs=args.prompts * args.samples, kv_cache_memory_bytes=KV_CACHE_BYTES,
                   enforce_eager=args.eager)

    def generate(reqs) -> int:
        s = reqs[0].sampling
        params = vllm.SamplingParams(n=reqs[0].n, temperature=s.temperature, max_tokens=s.max_new_tokens,
                                     ignore_eos=True, detokenize=False)  # token ids in and out, as ours
        prompts = [vllm.inputs.TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in reqs]
        outs = llm.generate(prompts, params, use_tqdm=False)
        return sum(len(c.token_ids) for o in outs for c in o.outputs)
    return generate


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=("native", "vllm"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--eager", action="store_true",
                   help="vllm: enforce_eager (a smoke run's start-up, not vLLM's default)")
    args = p.parse_args()
    from bench.rollout import MAX_PROMPT, requests_for
    from rlinf_like.models import read_hf_config

    args.context = MAX_PROMPT + args.new_tokens
    requests = requests_for(read_hf_config(args.model)["vocab_size"], args.prompts, args.samples, args.new_tokens)
    start = time.perf_counter()
    generate = (native_side if args.engine == "native" else vllm_side)(args, requests)
    startup = time.perf_counter() - start
    start = time.perf_counter()
    generate(requests[:2])
    say(startup_s=startup, warmup_s=time.perf_counter() - start)
    for line in sys.stdin:
        if line.strip() != "run":
            continue
        start = time.perf_counter()
        tokens = generate(requests)
        say(seconds=time.perf_counter() - start, tokens=tokens)


if __name__ == "__main__":
    main()
