"""One micro-batch's forward and backward with each group's prompt laid out once (`[prompt, r1, ..., rn]` under a
4-D mask, hybrid_engines/prompt_sharing.py) against each sample's own padded row, on any device.

Random weights of a real shape built from its config.json, GRPO-shaped micro-batches of `--groups` prompts with
`--samples` answers each, for each PROMPTxANSWER token count of `--cases` (the main job's and GSM8K's by default).
Each side runs `token_stats` (the actor's logprobs and entropy) and the backward of a GRPO-like sum, after one
untimed warm-up of each; the sides alternate over `--reps`. It prints the attention path the model
runs, the tokens and mask pairs each layout computes, the rule's choice (`share_batch` with the model's
`pair_cost`, which counts the dense mask's pairs as SDPA on CPU computes them), and the peak device memory on
CUDA. Last line: one JSON object of shared/rows time ratios from medians.

    python bench/share_prompt_layout.py --device cpu --cases 36x28 --groups 2 --reps 3
    python bench/share_prompt_layout.py --device cuda --dtype bfloat16 --cases 36x28,128x200,256x1024 --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Machine, alternating, random_weights_model, result_line  # noqa: E402
from rlinf_like.data.batch import build_rl_batch  # noqa: E402
from rlinf_like.hybrid_engines import head_stats  # noqa: E402
from rlinf_like.hybrid_engines.model_manager import token_stats  # noqa: E402
from rlinf_like.hybrid_engines.prompt_sharing import attention_kind, pair_cost, share_batch  # noqa: E402
from rlinf_like.utils.hardware import auto_precision  # noqa: E402


def groups_batch(groups: int, samples: int, prompt: int, answer: int, vocab: int, seed: int) -> dict:
    """GRPO-shaped rows: each prompt's answers of `answer` +- 25% tokens, so rows are padded as in a real batch."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for _ in range(groups):
        tokens = torch.randint(4, vocab, (prompt,), generator=g).tolist()
        for _ in range(samples):
            length = max(1, int(answer * (0.75 + 0.5 * torch.rand(1, generator=g).item())))
            prompts.append(tokens)
            responses.append(torch.randint(4, vocab, (length,), generator=g).tolist())
    advantages = torch.randn(len(prompts), generator=g).tolist()
    return build_rl_batch(prompts, responses, [[-1.0] * len(r) for r in responses], advantages)


def on(batch: dict, device: str) -> dict:
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}  # tensors and SharedPrompts


def step(model, batch: dict, chunk_bytes: int = head_stats.CHUNK_BYTES) -> None:
    model.zero_grad(set_to_none=True)
    logprobs, entropy = token_stats(model, batch, 1.0, entropy_grad=True, chunk_bytes=chunk_bytes)
    mask = batch["response_mask"]
    ((logprobs * batch["advantages"] + 0.01 * entropy) * mask).sum().backward()


def timed(model, batch: dict, device: str, chunk_bytes: int, host: list[float]) -> float:
    """The step's wall seconds; on CUDA `host` gains the seconds until Python had queued the step's work: a wall
    near it says the host set the pace (its launches, or a sync inside the step), not the device."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(model, batch, chunk_bytes)
    if device.startswith("cuda"):
        host.append(time.perf_counter() - start)
        torch.cuda.synchronize()
    return time.perf_counter() - start


def top_ops(model, batch: dict, device: str, chunk_bytes: int, rows: int = 12) -> str:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        step(model, batch, chunk_bytes)
        if cuda:
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                        help="auto: bf16 on a GPU and on a CPU with bf16 units, else fp32 (the runs' precision: auto)")
    parser.add_argument("--from-config", default=str(ROOT / "bench" / "configs" / "smollm2-135m.json"))
    parser.add_argument("--cases", default="36x28,128x200", help="PROMPTxANSWER tokens, comma-separated")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--chunk-mb", type=int, default=head_stats.CHUNK_BYTES >> 20,
                        help="the output layer's fp32 logits a chunk, MiB (a batch whose logits fit runs one pass)")
    parser.add_argument("--profile", action="store_true",
                        help="after the timings, each side's top ops (torch.profiler)")
    args = parser.parse_args()
    if args.dtype == "auto":
        precision, why = auto_precision(torch.device(args.device))
        args.dtype = {"bf16": "bfloat16", "fp32": "float32"}[precision]
        print(f"precision: {precision} ({why})")
    dtype = getattr(torch, args.dtype)
    chunk_bytes = args.chunk_mb << 20
    machine = Machine.start(vars(args))
    model = random_weights_model(args.from_config, dtype=dtype, attn_implementation="sdpa").to(args.device)
    cost = pair_cost(model)
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"attention: {attention_kind(model)}, pair cost {cost:.2e} of a token's other FLOPs")
    ratios = {}
    for case in args.cases.split(","):
        prompt, answer = (int(x) for x in case.split("x"))
        rows = groups_batch(args.groups, args.samples, prompt, answer, model.config.vocab_size, seed=prompt + answer)
        shared = share_batch(rows)
        plan = shared["shared_prompts"]
        chosen = "shared" if "shared_prompts" in share_batch(rows, cost) else "rows"
        rows, shared = on(rows, args.device), on(shared, args.device)
        width = rows["input_ids"].shape[1]
        print(f"{case}: rows {tuple(rows['input_ids'].shape)} ({rows['input_ids'].numel()} positions, "
              f"{rows['input_ids'].shape[0] * width * width} mask pairs); shared {tuple(plan.input_ids.shape)} "
              f"({plan.input_ids.numel()} positions, {plan.mask.numel()} mask pairs); the rule picks {chosen}")
        sides = {"rows": rows, "shared": shared}
        peaks = {}
        for name, batch in sides.items():  # warm-up: kernels, allocator; the peak of one step each
            if args.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            step(model, batch, chunk_bytes)
            if args.device.startswith("cuda"):
                peaks[name] = torch.cuda.max_memory_allocated() / 2**30
        queued = {name: [] for name in sides}
        times = alternating({name: (lambda rep, b=batch, q=queued[name]: timed(model, b, args.device, chunk_bytes, q))
                             for name, b in sides.items()},
                            args.reps, show=lambda rep, v: print(f"  rep {rep}: " + ", ".join(
                                f"{k} {s * 1000:.1f} ms" for k, s in v.items()), flush=True))
        med = {k: statistics.median(v) for k, v in times.items()}
        peak = (f"; peak {peaks['rows']:.2f} GiB rows, {peaks['shared']:.2f} GiB shared; queued by the host in "
                f"{statistics.median(queued['rows']) * 1000:.1f} / {statistics.median(queued['shared']) * 1000:.1f} ms"
                if peaks else "")
        print(f"  median: rows {med['rows'] * 1000:.1f} ms, shared {med['shared'] * 1000:.1f} ms, "
              f"shared/rows {med['shared'] / med['rows']:.3f}{peak}")
        if args.profile:
            for name, batch in sides.items():
                print(f"  {name}: the top ops of one step, by self device time")
                print(top_ops(model, batch, args.device, chunk_bytes))
        ratios[f"shared_over_rows_{case}"] = med["shared"] / med["rows"]
    machine.end()
    print(result_line("share_prompt_layout", **ratios))


if __name__ == "__main__":
    main()
