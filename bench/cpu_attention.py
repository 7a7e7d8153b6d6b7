"""A training pass on CPU under bf16 autocast with transformers' SDPA against the float32 routing of short sequences'
attention (rlinf_like/hybrid_engines/cpu_attention.py).

The actor's own setting: an HF checkpoint as a plain module, gradient checkpointing on, forward under bf16 autocast,
64 rows (8 prompts of 36 tokens x 8 answers of 8-28 tokens, padded per micro-batch) in micro-batches of 8 rows,
forward + backward of the summed response logprobs, one thread. The two sides alternate in one process over
`--reps` repetitions, each after one untimed pass of its own; nothing is cached between passes (autocast's weight
casts are dropped when each micro-batch's region ends). Last line: one JSON object.

    python bench/cpu_attention.py [--model models/smollm2-135m-instruct] [--reps 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Machine, alternating, result_line  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 repetition over 2 of the 8 micro-batches")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import AttentionInterface

    from rlinf_like.data.batch import build_rl_batch
    from rlinf_like.hybrid_engines import cpu_attention
    from rlinf_like.hybrid_engines.model_manager import token_stats

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    machine = Machine.start({"model": args.model, "reps": args.reps, "rows": "8 prompts x 8 answers",
                             "micro_batch_rows": 8, "autocast": "bf16", "gradient_checkpointing": True,
                             "threads": torch.get_num_threads(), "fp32_below": cpu_attention.FP32_BELOW})
    model = AutoModelForCausalLM.from_pretrained(ROOT / args.model, torch_dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    g = torch.Generator().manual_seed(0)
    prompts, responses = [], []
    for _ in range(8):
        prompt = torch.randint(100, 40000, (36,), generator=g).tolist()
        for _ in range(8):
            prompts.append(prompt)
            responses.append(torch.randint(100, 40000, (int(torch.randint(8, 29, (1,), generator=g)),),
                                           generator=g).tolist())
    micro = [build_rl_batch(prompts[i:i + 8], responses[i:i + 8], [[-1.0] * len(r) for r in responses[i:i + 8]],
                            [1.0] * 8) for i in range(0, 64, 8)]
    if args.quick:
        args.reps, micro = 1, micro[:2]
    plain = AttentionInterface._global_mapping["sdpa"]
    routed = cpu_attention._wrap(plain)

    def side(fn):
        def one_pass() -> float:
            AttentionInterface.register("sdpa", fn)
            start = time.perf_counter()
            for batch in micro:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    logprobs, _ = token_stats(model, batch, 1.0)
                    loss = -(logprobs * batch["response_mask"]).sum()
                loss.backward()
            model.zero_grad(set_to_none=True)
            return time.perf_counter() - start

        def measure(rep: int) -> float:
            if rep == 0:
                one_pass()  # warm-up: first-call kernel selection
            return one_pass()
        return measure

    times = alternating({"sdpa_bf16": side(plain), "fp32_short": side(routed)}, args.reps,
                        show=lambda rep, v: print(f"rep {rep}: transformers sdpa {v['sdpa_bf16']:.2f} s, float32 "
                                                  f"short attention {v['fp32_short']:.2f} s", flush=True))
    AttentionInterface.register("sdpa", plain)
    machine.end()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"medians: transformers sdpa {med['sdpa_bf16']:.2f} s, float32 short attention {med['fp32_short']:.2f} s "
          f"per forward+backward of 64 rows")
    print(result_line("cpu_attention", pass_s_sdpa_bf16=med["sdpa_bf16"], pass_s_fp32_short=med["fp32_short"],
                      ratio=med["fp32_short"] / med["sdpa_bf16"],
                      ratio_per_rep=[a / b for a, b in zip(times["fp32_short"], times["sdpa_bf16"])]))


if __name__ == "__main__":
    main()
