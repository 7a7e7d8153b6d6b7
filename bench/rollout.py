"""Rollout throughput: the native engine versus transformers' `generate`, same model, same batch.

32 prompts of ragged length x 4 samples each, sampled at temperature 1 with EOS ignored, so both
engines produce exactly the same number of tokens. Both run in this process on one thread;
repetitions alternate and medians are compared.
Last line: one JSON object, ratio = native tokens/s / HF tokens/s (target >= 1.5).

    python bench/rollout.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    prompts, samples, new_tokens, reps = (8, 4, 32, 1) if args.quick else (32, 4, args.new_tokens, 3)
    spec = TinyModelSpec(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_layers=args.layers,
                         num_heads=8, num_kv_heads=4, max_position_embeddings=1024)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(write_tiny_model(tmp, spec))
        params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True, seed=0)
        gen = torch.Generator().manual_seed(0)
        requests = [RolloutRequest(f"p{i}", torch.randint(4, 90, (int(torch.randint(8, 48, (1,), generator=gen)),),
                                                          generator=gen).tolist(), params, samples)
                    for i in range(prompts)]
        engines = {"native": make_engine(RolloutConfig(engine="native", model_path=path,
                                                       max_batch_size=prompts * samples)),
                   "hf": make_engine(RolloutConfig(engine="hf", model_path=path))}
        tokens_per_run = prompts * samples * new_tokens
        times: dict[str, list[float]] = {name: [] for name in engines}
        for name, engine in engines.items():  # warm-up (allocations, first-call overheads)
            engine.generate(requests[:2])
        for _ in range(reps):
            for name, engine in engines.items():
                start = time.perf_counter()
                results = engine.generate(requests)
                times[name].append(time.perf_counter() - start)
                produced = sum(len(t) for r in results for t in r.response_ids)
                assert produced == tokens_per_run, (name, produced)
    rate = {name: tokens_per_run / statistics.median(t) for name, t in times.items()}
    ratio = rate["native"] / rate["hf"]
    print(f"{prompts} prompts x {samples} samples x {new_tokens} new tokens, {spec.num_layers} layers, "
          f"hidden {spec.hidden_size}, one thread")
    print(f"native {rate['native']:.0f} tokens/s   transformers generate {rate['hf']:.0f} tokens/s   ratio {ratio:.2f}")
    print(json.dumps({"bench": "rollout", "ratio": round(ratio, 3), "tokens": tokens_per_run}))


if __name__ == "__main__":
    main()
