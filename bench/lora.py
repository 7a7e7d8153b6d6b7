"""LoRA versus full fine-tuning in the actor: one GRPO training step on the same batch, the weight-sync
bytes per step after the first, and the actor process's peak resident memory.

Each measurement runs the project's own actor (`ActorWorker.train_step`: the FSDP manager, the RL loss, the
training loop, AdamW, fp32 on CPU) in a fresh subprocess (one gloo rank, one thread), so peak memory is
that process's own. One subprocess per side and repetition, sides alternated (full, lora, full, lora, ...);
each does a warm-up step (Adam state, first-call costs), then times one step (forward + backward +
optimizer step) on the same saved batch. Sync bytes are the actor's `SyncPlan` to the native rollout
engine's layouts: every tensor each step for full fine-tuning, the plan's delta (the adapters, which the
rollout merges) after the first round under LoRA. The defaults follow the `grpo_smollm2` preset as one of its two
actor ranks sees a step: 16 rows (2 prompts x 8 samples, chat-templated arithmetic prompts, responses of
up to 48 tokens), micro-batches of 8, LoRA rank 16, alpha 32, every linear layer.
Step time is the step's CPU seconds (user + system) of the one-thread actor process, the wall seconds
printed beside it: on the shared development VM (load 3-17) the wall clock mostly measures the neighbours
(the same step took 19-77 s wall for 17-20 s of CPU), and for a one-thread process alone on a core the
two agree. Peak memory is the process's VmHWM (resident high-water mark, model loading included).
Last line: one JSON object, each ratio LoRA / full of the medians (targets: step time <= 0.6,
sync bytes <= 0.1, memory <= 0.6).

    python -m rlinf_like.models.get smollm2-135m-instruct models/   # once
    python bench/lora.py [--reps 3] [--model models/smollm2-135m-instruct]
    python bench/lora.py --quick   # a tiny random model, one repetition
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT_MODEL = ROOT / "models" / "smollm2-135m-instruct"
SYSTEM_PROMPT = "Solve the problem. Put only the final number in \\boxed{}."  # the preset's
QV = ["q_proj", "v_proj"]


# --- the actor side: one subprocess per measurement -------------------------------------------------------
def peak_rss_bytes() -> int:
    """The process's peak resident set. VmHWM belongs to this process's own address space; ru_maxrss would
    carry the parent's high-water mark over a vfork + exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def rss_bytes() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def actor_config(spec: dict):
    from rlinf_like.hybrid_engines.fsdp import FSDPConfig
    from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig
    from rlinf_like.hybrid_engines.model_manager import OptimConfig
    from rlinf_like.training.loop import LoopConfig
    from rlinf_like.workers.actor.worker import ActorConfig

    lora = LoraConfig(rank=spec["rank"], alpha=spec["alpha"], target_modules=spec["targets"])
    return ActorConfig(model_path=spec["model"], loop=LoopConfig(micro_batch_size=spec["micro_batch"]),
                       fsdp=FSDPConfig(precision="fp32", optim=OptimConfig(lr=2e-4), lora=lora))


def sync_bytes(worker, model_path: str) -> tuple[int, int]:
    """(first round, each later round) of the actor's plan to a native rollout engine (tp=1, fp32)."""
    from rlinf_like.hybrid_engines.lora_sync import with_adapters
    from rlinf_like.hybrid_engines.reshard import SyncPlan
    from rlinf_like.workers.rollout.engines.native.model import model_config, weight_layouts

    # the rollout's layouts, with the adapters it receives and merges under LoRA (as RolloutWorker.weight_layouts)
    targets = with_adapters(weight_layouts(model_config(model_path), 1, torch.float32), worker.adapter_spec())
    plan = SyncPlan.build(worker.weight_layouts(), targets, "actor", "rollout", changing=worker.changing_tensors())
    return plan.nbytes, (plan.delta or plan).nbytes


def run_side(spec: dict) -> dict:
    import time

    import torch.distributed as dist

    from rlinf_like.workers.actor.worker import ActorWorker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # what a Worker gets, alone
    worker = ActorWorker(actor_config(spec))
    out = {"trainable": worker.manager.get_config()["trainable_params"], "built_rss": rss_bytes()}
    if spec["train"]:
        batch = torch.load(spec["batch"])
        worker.train_step(batch)  # warm-up: Adam state, first-call allocations
        start, cpu = time.perf_counter(), time.process_time()
        worker.train_step(batch)
        # CPU seconds beside wall seconds: on a shared machine the wall clock also counts waiting for a core
        out.update(step_s=time.perf_counter() - start, step_cpu_s=time.process_time() - cpu, peak_rss=peak_rss_bytes())
    out["first_sync_bytes"], out["sync_bytes"] = sync_bytes(worker, spec["model"])
    dist.destroy_process_group()
    return out


def measure(spec: dict) -> dict:
    """`run_side(spec)` in a fresh interpreter; its last stdout line is the result."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, __file__, "--side", json.dumps(spec)], env=env, capture_output=True,
                          text=True)
    if done.returncode:
        raise RuntimeError(f"side {spec['name']} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- the shared batch --------------------------------------------------------------------------------------
def write_batch(model_path: str, path: Path, prompts: int, samples: int, max_response: int, seed: int = 0):
    """One GRPO batch, saved for every side: chat-templated prompts, random responses of ragged length,
    GRPO advantages of random 0/1 rewards, and the base model's logprobs as the old policy's."""
    from transformers import AutoModelForCausalLM

    from rlinf_like.algorithms.advantage_estimators.grpo import grpo_advantages
    from rlinf_like.data.batch import build_rl_batch
    from rlinf_like.data.config import DataConfig
    from rlinf_like.data.prompts import PromptFormat
    from rlinf_like.data.tasks import Problem
    from rlinf_like.hybrid_engines.model_manager import token_logprobs
    from rlinf_like.models import load_tokenizer

    g = torch.Generator().manual_seed(seed)
    tokenizer = load_tokenizer(model_path)
    fmt = PromptFormat(tokenizer, DataConfig(system_prompt=SYSTEM_PROMPT))
    operands = torch.randint(0, 10, (prompts, 2), generator=g).tolist()
    prompt_ids = [fmt.prompt_ids(Problem(prompt=f"{a} + {b} =", answer=str(a + b))) for a, b in operands]
    rows = [ids for ids in prompt_ids for _ in range(samples)]
    lengths = torch.randint(max_response // 2, max_response + 1, (len(rows),), generator=g).tolist()
    responses = [torch.randint(3, len(tokenizer), (n,), generator=g).tolist() for n in lengths]
    rewards = torch.randint(0, 2, (prompts, samples), generator=g).float()
    advantages = grpo_advantages(rewards).flatten().tolist()
    batch = build_rl_batch(rows, responses, [[0.0] * n for n in lengths], advantages, pad_id=tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        batch["old_logprobs"] = token_logprobs(model, batch) * batch["response_mask"]
    torch.save(batch, path)
    return batch


# --- the driver ----------------------------------------------------------------------------------------------
def machine() -> str:
    return (f"{os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} usable), {platform.machine()}, "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a tiny random model, one repetition")
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--side", help=argparse.SUPPRESS)  # internal: run one side (a JSON spec) and exit
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_side(json.loads(args.side))))
        return

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_lora_") as tmp:
        if args.quick:
            from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

            model = str(write_tiny_model(Path(tmp) / "tiny", TinyModelSpec(arch="llama", hidden_size=128,
                                                                           intermediate_size=352)))
            prompts, samples, max_response, micro, reps, rank, alpha = 2, 4, 16, 4, 1, 8, 16.0
        else:
            if not (Path(args.model) / "config.json").exists():
                sys.exit(f"no model at {args.model}: run `python -m rlinf_like.models.get smollm2-135m-instruct models/`")
            model = args.model
            prompts, samples, max_response, micro, reps, rank, alpha = 2, 8, 48, 8, args.reps, 16, 32.0
        print(f"machine: {machine()}; load average at start {load()}")
        batch = write_batch(model, Path(tmp) / "batch.pt", prompts, samples, max_response)
        width = batch["input_ids"].shape[1]
        print(f"model {model}; batch {prompts} prompts x {samples} samples = {prompts * samples} rows, "
              f"{int(batch['attention_mask'].sum())} tokens ({int(batch['response_mask'].sum())} response), padded "
              f"length {width}; micro-batches of {micro}; AdamW lr 2e-4, fp32, one thread per process")
        print(f"lora: rank {rank}, alpha {alpha:g}, targets all linear layers (peft 'all-linear'); "
              f"{reps} repetitions, sides alternated, each a fresh process (warm-up step, then one timed step)")
        base = dict(model=model, batch=str(Path(tmp) / "batch.pt"), micro_batch=micro, alpha=alpha, train=True)
        sides = {"full": dict(base, name="full", rank=0, targets=[]),
                 "lora": dict(base, name="lora", rank=rank, targets=[])}
        results: dict[str, list[dict]] = {name: [] for name in sides}
        for rep in range(reps):
            for name, spec in sides.items():
                results[name].append(measure(spec))
                r = results[name][-1]
                print(f"  rep {rep} {name:>4}: step {r['step_s']:.2f} s wall, {r['step_cpu_s']:.2f} s CPU; resident "
                      f"{r['built_rss'] / 2**20:.0f} MiB once built, peak {r['peak_rss'] / 2**20:.0f} MiB "
                      f"(load {load()})", flush=True)
        # the extra figure needs only the plan, no step or memory: built here, after the measured sides
        qv = run_side(dict(base, name="lora-qv", rank=rank, targets=QV, train=False))

    keys = ("step_s", "step_cpu_s", "peak_rss", "built_rss", "sync_bytes")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in results.items()}
    ratio = {k: med["lora"][k] / med["full"][k] for k in keys}
    full, lora = results["full"][0], results["lora"][0]
    print(f"{'':>20} {'full':>12} {'lora':>12} {'lora / full':>12}")
    print(f"{'step (median s)':>20} {med['full']['step_s']:>12.2f} {med['lora']['step_s']:>12.2f} {ratio['step_s']:>12.3f}")
    print(f"{'step (median CPU s)':>20} {med['full']['step_cpu_s']:>12.2f} {med['lora']['step_cpu_s']:>12.2f} "
          f"{ratio['step_cpu_s']:>12.3f}")
    print(f"{'built RSS (MiB)':>20} {med['full']['built_rss'] / 2**20:>12.0f} {med['lora']['built_rss'] / 2**20:>12.0f} "
          f"{ratio['built_rss']:>12.3f}")
    print(f"{'peak RSS (MiB)':>20} {med['full']['peak_rss'] / 2**20:>12.0f} {med['lora']['peak_rss'] / 2**20:>12.0f} "
          f"{ratio['peak_rss']:>12.3f}")
    print(f"{'sync bytes / step':>20} {med['full']['sync_bytes']:>12,} {med['lora']['sync_bytes']:>12,} "
          f"{ratio['sync_bytes']:>12.3f}")
    print(f"{'first sync bytes':>20} {full['first_sync_bytes']:>12,} {lora['first_sync_bytes']:>12,}")
    print(f"{'trainable params':>20} {full['trainable']:>12,} {lora['trainable']:>12,} "
          f"{lora['trainable'] / full['trainable']:>12.4f}")
    print(f"extra: lora targets [q_proj, v_proj]: sync bytes per step after the first {qv['sync_bytes']:,} of "
          f"{qv['first_sync_bytes']:,} (ratio {qv['sync_bytes'] / full['sync_bytes']:.3f})")
    print(f"load average at end {load()}")
    print(f"step_time_ratio is the CPU-seconds ratio; by wall clock {ratio['step_s']:.3f}")
    print(json.dumps({"bench": "lora", "step_time_ratio": round(ratio["step_cpu_s"], 3),
                      "sync_bytes_ratio": round(ratio["sync_bytes"], 3), "memory_ratio": round(ratio["peak_rss"], 3)}))


if __name__ == "__main__":
    main()
