"""TRL's side of bench/grpo_vs_trl.py, in its own process: GRPOTrainer from the shared warm start.

Writes `<out>/timing.json` (per step: the GRPO seconds so far) and a snapshot of the weights at every
evaluation step (`<out>/step_<n>`), which the parent evaluates with the same function as ours. The clock
starts at `on_train_begin` (model and trainer built) and stops at each `on_step_end` (after the optimizer
step); the snapshots are outside it.

    python bench/grpo_trl_side.py --warm DIR --out DIR --seed 0 --steps 60 --eval-every 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_like.data.config import DataConfig  # noqa: E402
from rlinf_like.data.prompts import PromptFormat  # noqa: E402
from rlinf_like.data.sources import load_tasks  # noqa: E402
from rlinf_like.models import load_tokenizer  # noqa: E402
from rlinf_like.workers.reward import score  # noqa: E402

# Every GRPOConfig setting that matters here, explicit; the comment says where TRL 1.16's default differs.
TRL_SETTINGS = dict(
    per_device_train_batch_size=256,  # 32 prompts x 8 samples per optimizer step (default 8)
    gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,  # one step per generation, as ours
    num_generations=8, max_completion_length=28,  # (default 512)
    temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0,
    learning_rate=2e-4, lr_scheduler_type="constant", warmup_steps=0,  # (defaults 1e-6, linear)
    optim="adamw_torch_fused", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
    max_grad_norm=1.0,  # ours clips at 1.0 too
    beta=0.0,  # no KL term and no reference model, as ours (kl_beta 0); TRL 1.16 defaults to 0.0 too
    epsilon=0.2, epsilon_high=0.2, loss_type="dapo", scale_rewards="group",
    importance_sampling_level="token", mask_truncated_completions=False,
    bf16=False, fp16=False,  # fp32 as ours (default bf16=True, ~5x slower per step on this CPU)
    gradient_checkpointing=False,  # (default True: recomputes the forward, slower)
    torch_compile=False, use_liger_kernel=False, use_vllm=False, use_transformers_paged=False,
    disable_dropout=True, shuffle_dataset=True, dataloader_num_workers=0,
    use_cpu=True, report_to="none", save_strategy="no", logging_steps=10_000, log_completions=False,
)


def time_generation(trainer, seconds: list[float]) -> None:
    """Append the seconds of each of `trainer`'s generation-and-scoring calls (a GRPOTrainer's
    `_generate_and_score_completions`: the rest of its step is training) to `seconds`."""
    produce = trainer._generate_and_score_completions

    def timed(*a, **kw):
        start = time.perf_counter()
        out = produce(*a, **kw)
        seconds.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--warm", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(args.warm)
    model = AutoModelForCausalLM.from_pretrained(args.warm, dtype=torch.float32)
    pool = load_tasks(DataConfig()).pool
    rng = random.Random(args.seed)
    rows = [rng.choice(pool) for _ in range(32 * args.steps)]
    text = PromptFormat(tok, DataConfig()).text  # the prompt exactly as ours sends it
    data = Dataset.from_dict({"prompt": [text(r) for r in rows], "answer": [r.answer for r in rows]})

    def reward(completions, answer, **_):
        return [score(c, a, True, 1).total for c, a in zip(completions, answer)]

    elapsed: list[float] = []
    generate_s: list[float] = []  # per step: TRL's generation and scoring (the rest of the step is training)

    class Clock(TrainerCallback):
        def on_train_begin(self, args_, state, control, **kwargs):
            self.start, self.paused = time.perf_counter(), 0.0

        def on_step_end(self, args_, state, control, model=None, **kwargs):
            now = time.perf_counter()
            elapsed.append(now - self.start - self.paused)
            if state.global_step % args.eval_every == 0 or state.global_step == args.steps:
                model.save_pretrained(args.out / f"step_{state.global_step}")
                self.paused += time.perf_counter() - now

    config = GRPOConfig(output_dir=str(args.out / "trainer"), max_steps=args.steps, seed=args.seed, **TRL_SETTINGS)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()])
    time_generation(trainer, generate_s)
    effective = {k: str(getattr(config, k)) for k in sorted(TRL_SETTINGS) if k not in ("report_to",)}
    effective.update(torch_threads=torch.get_num_threads(), model_dtype=str(next(model.parameters()).dtype),
                     gradient_checkpointing_on=bool(getattr(model, "is_gradient_checkpointing", False)))
    trainer.train()
    (args.out / "timing.json").write_text(json.dumps({"elapsed_s": elapsed, "generate_s": generate_s, "config": effective}))


if __name__ == "__main__":
    main()
