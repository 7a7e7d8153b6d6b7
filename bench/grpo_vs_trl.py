"""Wall time to the same held-out accuracy: our GRPO runner versus TRL's GRPOTrainer.

Same warm-started model (one SFT run, saved once), same task, same held-out set, same GRPO
settings (32 prompts x 8 samples per optimizer step, lr 2e-4 constant, clip 0.2, no KL, group
std scaling, token-level loss, 28 new tokens at temperature 1), same machine. Ours runs the
collocated preset (2 worker processes, one thread each); TRL runs in one process with both
threads. Evaluation (greedy accuracy on the held-out set) is excluded from both clocks. The target
is the warm-start accuracy + `--gain`; a side that never reaches it within its step budget counts
its whole time (then the ratio is a bound, and says so).
Last line: one JSON object, time_ratio = ours / TRL (target <= 0.5).

    pip install trl   # only for this benchmark
    python bench/grpo_vs_trl.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_like.data.batch import build_sft_batch  # noqa: E402
from rlinf_like.models import load_tokenizer  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from rlinf_like.runners.config import ModelConfig, ReasoningConfig  # noqa: E402
from rlinf_like.runners.reasoning import load_tasks  # noqa: E402
from rlinf_like.workers.reward import score  # noqa: E402


def warm_start(root: Path, steps: int) -> tuple[Path, list, list]:
    """The runner's SFT warm-start, in this process, saved as an HF checkpoint both sides start from."""
    from transformers import AutoModelForCausalLM

    cfg = ReasoningConfig()
    cfg.runner.output_dir = str(root / "tasks")
    tasks = load_tasks(cfg.data)
    m: ModelConfig = cfg.model
    init = write_tiny_model(root / "init", TinyModelSpec(arch=m.arch, hidden_size=m.hidden_size,
                                                         intermediate_size=m.intermediate_size, num_layers=m.num_layers,
                                                         num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                                                         init_std=m.init_std, seed=m.seed))
    tok = load_tokenizer(init)
    model = AutoModelForCausalLM.from_pretrained(init)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.runner.sft_lr, weight_decay=0.0)
    rng = random.Random(0)
    for _ in range(steps):
        items = [rng.choice(tasks.sft) for _ in range(cfg.runner.sft_batch_size)]
        batch = build_sft_batch([tok(p.prompt).input_ids for p in items],
                                [tok(p.solution).input_ids + [tok.eos_token_id] for p in items])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        mask = batch["loss_mask"][:, 1:].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["input_ids"][:, 1:], reduction="none")
        loss = (nll * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    warm = root / "warm"
    model.save_pretrained(warm)
    tok.save_pretrained(warm)
    return warm, tasks.test, tasks.pool


@torch.inference_mode()
def greedy_accuracy(model, tok, problems, max_new_tokens: int = 28) -> float:
    prompts = [tok(p.prompt).input_ids for p in problems]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    was_training = model.training
    model.eval()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    model.train(was_training)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(score(t, p.answer, True, 1).correct for t, p in zip(texts, problems)) / len(problems)


def run_ours(warm: Path, out: Path, steps: int, eval_every: int) -> list[tuple[float, float]]:
    """(elapsed GRPO seconds, held-out accuracy) at each evaluation."""
    cmd = [sys.executable, str(ROOT / "examples/reasoning/main_grpo.py"), f"model.path={warm}",
           "runner.sft_steps=0", f"runner.max_steps={steps}", f"runner.eval_every={eval_every}",
           f"runner.save_every={steps}", f"runner.output_dir={out}"]
    subprocess.run(cmd, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                   stdout=subprocess.DEVNULL)
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"]
    return [(h.get("elapsed_s", 0.0), h["eval_accuracy"]) for h in history if "eval_accuracy" in h]


def run_trl(warm: Path, out: Path, pool, test, steps: int, eval_every: int) -> list[tuple[float, float]]:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(2)  # the whole machine, as our two workers have
    tok = load_tokenizer(warm)
    model = AutoModelForCausalLM.from_pretrained(warm)
    rng = random.Random(0)
    rows = [rng.choice(pool) for _ in range(32 * steps)]
    data = Dataset.from_dict({"prompt": [p.prompt for p in rows], "answer": [p.answer for p in rows]})

    def reward(completions, answer, **_):
        return [score(c, a, True, 1).total for c, a in zip(completions, answer)]

    points: list[tuple[float, float]] = []

    class Clock(TrainerCallback):
        def __init__(self):
            self.start, self.paused = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % eval_every == 0:
                t0 = time.perf_counter()
                elapsed = t0 - self.start - self.paused
                points.append((elapsed, greedy_accuracy(model, tok, test)))
                self.paused += time.perf_counter() - t0

    args = GRPOConfig(output_dir=str(out), per_device_train_batch_size=256, num_generations=8,
                      max_completion_length=28, temperature=1.0, learning_rate=2e-4, lr_scheduler_type="constant",
                      beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group", max_steps=steps,
                      use_cpu=True, report_to="none", logging_steps=10, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()])
    points.insert(0, (0.0, greedy_accuracy(model, tok, test)))
    trainer.train()
    return points


def time_to(points: list[tuple[float, float]], target: float) -> tuple[float, bool]:
    for elapsed, acc in points:
        if acc >= target - 1e-9:  # accuracies are k / n: compare without float noise
            return elapsed, True
    return points[-1][0], False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--gain", type=float, default=0.15, help="target = warm-start accuracy + gain")
    args = parser.parse_args()
    sft_steps, steps, eval_every = (150, 10, 5) if args.quick else (300, 60, 5)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        warm, test, pool = warm_start(root, sft_steps)
        ours = run_ours(warm, root / "ours", steps, eval_every)
        trl = run_trl(warm, root / "trl", pool, test, steps, eval_every)
    start_acc = ours[0][1]
    target = start_acc + args.gain
    ours_s, ours_hit = time_to(ours, target)
    trl_s, trl_hit = time_to(trl, target)
    print(f"warm start {start_acc:.3f} held-out accuracy (TRL's own eval: {trl[0][1]:.3f}); target {target:.3f}")
    for name, points in (("ours", ours), ("TRL", trl)):
        print(f"{name:>5}: " + "  ".join(f"{t:.0f}s:{a:.2f}" for t, a in points))
    ratio = ours_s / trl_s
    bound = "" if ours_hit and trl_hit else " (bound: " + ("ours" if not ours_hit else "TRL") + " did not reach it)"
    print(f"time to target: ours {ours_s:.0f} s, TRL {trl_s:.0f} s, ratio {ratio:.3f}{bound}")
    print(json.dumps({"bench": "grpo_vs_trl", "time_ratio": round(ratio, 3), "target_accuracy": round(target, 3),
                      "ours_reached": ours_hit, "trl_reached": trl_hit}))


if __name__ == "__main__":
    main()
