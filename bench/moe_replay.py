"""Rollout routing replay (R3) on a mixture-of-experts model: the train/rollout mismatch with and without replay, the
router agreement, and what returning the routes costs the rollout.

The native engine samples in the rollout dtype (bf16 by default) with `rollout.return_routes`; the trainer (an HF
model in float32, the actor's numerics when it trains in fp32) then scores the same samples twice, once with its own
routers choosing and once replaying the engine's routes. The mismatch is KL(rollout || trainer) by the k3 estimator
over the response tokens (`mismatch/kl_k3`, as a run logs it), and mean |delta logp|. The route cost is the engine's
generate time with and without `return_routes`, alternated over the repetitions, and the bytes per token.

    python bench/moe_replay.py --quick                           # a tiny random Qwen3-MoE, CPU, seconds
    python bench/moe_replay.py --model models/smollm2-135m-moe4x2   # an upcycled SmolLM2 (rlinf_like.models.upcycle)
    python bench/moe_replay.py --device cuda --random-size 0.35b  # a random 0.35B Qwen3-MoE on a GPU

The last line is one JSON object: kl_ratio (with R3 / without), agreement, route_time_ratio (medians, with / without).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Machine, alternating, median_ratio, result_line  # noqa: E402
from rlinf_like.algorithms.offpolicy import mismatch_metrics  # noqa: E402
from rlinf_like.hybrid_engines import routing_replay  # noqa: E402
from rlinf_like.hybrid_engines.model_manager import token_logprobs  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model, char_tokenizer  # noqa: E402
from rlinf_like.runners.reasoning.phases import rl_batch  # noqa: E402
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine  # noqa: E402

# a random Qwen3-MoE of ~0.35B parameters: 12 layers, 16 experts of width 512, top 4, renormalised
RANDOM_035B = dict(hidden_size=1024, intermediate_size=2816, num_layers=12, num_heads=16, num_kv_heads=4,
                   num_experts=16, experts_per_token=4, moe_intermediate_size=512, norm_topk_prob=True)


def random_moe(path: Path, size: str) -> Path:
    """A seeded random Qwen3-MoE checkpoint: weights std 0.02, routers std 0.2 so that routes are not near uniform,
    and experts of std 1.6/sqrt(hidden) (0.2 at the tiny model's 64), so that an expert's output is of the size of
    the residual stream, as in a trained MoE. With the experts at 0.02 too, every expert's output is near 0 and
    which ones run hardly moves a logprob: the tiny model's KL ratio was then 0.96, against 0.04 with them."""
    fields = RANDOM_035B if size == "0.35b" else dict(num_layers=3)
    spec = TinyModelSpec(arch="qwen3_moe", init_std=0.02, max_position_embeddings=1024, **fields)
    model, tokenizer = build_tiny_model(spec)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if ".experts." in name:
                weight.normal_(0.0, 1.6 / spec.hidden_size ** 0.5)
        for router in routing_replay.routers(model):
            router.weight.normal_(0.0, 0.2)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def sample(path: str, args, routes: bool):
    engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=args.prompts * args.samples,
                                       dtype=args.rollout_dtype, return_routes=routes, prefix_cache=False),
                         device=args.device)
    gen = torch.Generator().manual_seed(0)
    vocab = len(char_tokenizer())
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0, ignore_eos=True, seed=1)
    requests = [RolloutRequest(f"p{i}", torch.randint(4, vocab, (args.prompt_tokens,), generator=gen).tolist(),
                               params, args.samples) for i in range(args.prompts)]
    engine.generate(requests[:1])  # warm-up: the kernels' first shapes
    start = time.perf_counter()
    results = engine.generate(requests)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return results, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="", help="a MoE checkpoint folder; empty: a random Qwen3-MoE")
    parser.add_argument("--random-size", default="tiny", choices=["tiny", "0.35b"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rollout-dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="tiny model, 2 prompts, 16 new tokens, 1 rep")
    args = parser.parse_args()
    if args.quick:
        args.model, args.random_size, args.prompts, args.new_tokens, args.reps = "", "tiny", 2, 16, 1
    torch.manual_seed(0)
    path = args.model or str(random_moe(Path(tempfile.mkdtemp()) / "moe", args.random_size))
    machine = Machine.start({**vars(args), "model": path, "trainer": "float32",
                             "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None})
    kept = {}

    def measure(routes: bool):
        def run(rep: int) -> float:
            kept[routes], seconds = sample(path, args, routes)
            return seconds
        return run

    # with and without routes alternated (a fresh engine each time: nothing carried between repetitions)
    times = alternating({"routes": measure(True), "plain": measure(False)}, args.reps,
                        show=lambda rep, t: print(f"rep {rep}: generate {t['routes']:.2f} s with routes, "
                                                  f"{t['plain']:.2f} s without", flush=True))
    batch = rl_batch(kept[True], pad_id=0)  # the run's own batch: rows, the rollout's logprobs and routes
    from transformers import AutoModelForCausalLM

    trainer = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(args.device)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    out = {}
    with torch.no_grad():
        for mode in ("disabled", "R3"):
            routing_replay.install(trainer, replay=mode == "R3")
            logprobs = token_logprobs(trainer, batch)
            got = mismatch_metrics(logprobs, batch["old_logprobs"], batch["response_mask"])
            agree = routing_replay.agreement(trainer, batch) if mode == "disabled" else {}
            out[mode] = {**got, **agree}
            print(f"{mode:>8}: kl_k3 {got['mismatch/kl_k3']:.3e}, "
                  f"mean |dlogp| {got['mismatch/abs_log_ratio_mean']:.3e}, "
                  f"max |dlogp| {got['mismatch/abs_log_ratio_max']:.3e}"
                  + (f", router agreement {agree['moe/router_agreement']:.4f}, tokens equal in all layers "
                     f"{agree['moe/tokens_all_layers_equal']:.4f}" if agree else ""))
    layers, k = batch["routes"].shape[2:]
    per_token = layers * k * batch["routes"].element_size()
    print(f"routes: {layers} MoE layers x top-{k} x {batch['routes'].element_size()} byte(s) = {per_token} bytes "
          "per token")
    machine.end()
    kl_free, kl_r3 = out["disabled"]["mismatch/kl_k3"], out["R3"]["mismatch/kl_k3"]
    print(result_line("moe_replay", digits=4, kl_ratio=kl_r3 / kl_free if kl_free else None,
                      agreement=out["disabled"]["moe/router_agreement"],
                      route_time_ratio=median_ratio(times["routes"], times["plain"]), bytes_per_token=per_token))


if __name__ == "__main__":
    main()
