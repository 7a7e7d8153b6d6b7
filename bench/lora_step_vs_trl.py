"""One GRPO step at GSM8K answer lengths with LoRA on SmolLM2-135M-Instruct: our runner against TRL's GRPOTrainer.

The setting is issue 49's: `--config-name grpo_smollm2 data=gsm8k_files` (the shipped GSM8K-format sample), 4
prompts x 8 samples, up to 200 new tokens at temperature 1, LoRA rank 16 / alpha 32 on every linear layer of the
decoder, the preset's learning rate (`algorithm.lr`), PPO clip 0.2, token-level loss, group-std advantages,
grad-norm clip 1.0, no KL term and no reference model, one optimizer step per generation. Ours runs the preset as a user does (`main_grpo.py`, on Ray:
an FSDP dp=2 actor and two native-engine replicas taking turns on the 2 cores, `actor.precision=auto`). TRL 1.16
runs in its own process with 2 torch threads, HF `generate` (no vLLM on this CPU), peft's LoRA with the same
rank, alpha and modules, and every differing default set (below, printed as the effective config); its
precision follows the same rule as ours: bf16 where the CPU has bf16 units, else fp32 (`--trl-precision` sets it;
on a Zen 4 host TRL's fp32 step was slower than its bf16 one, docs/benchmarks/reasoning.md).

Each side is a fresh process per repetition (nothing cached between repetitions: no warm prefix, no compiled
kernels), the sides alternated (ours first on even repetitions). A repetition runs `--steps` steps on the same
prompts (same seed) and times each step; the first step is a warm-up (first-call costs, the Adam state) and the
step time of a repetition is the median of the others. Ours: the runner's `step_s` (rollout, reward, training,
weight sync), TRL: `on_step_begin` to `on_step_end` (generation with scoring, then training), with each side's
rollout / generation share printed beside it. Last line: one JSON object, `step_ratio` = median(ours) /
median(TRL) over the repetitions, with the per-repetition ratios.

`--recipe ifeval` runs issue 50's recipe instead: `--config-name grpo_ifeval_smollm2` (generated instruction-following
prompts of the twelve trained constraint types, the share of a prompt's constraints followed as the reward, 256 new
tokens), with the same LoRA, optimizer and group settings; TRL's reward calls the same checkers on the same rows.

    python bench/lora_step_vs_trl.py [--reps 3] [--steps 3] [--trl-precision auto|fp32|bf16] [--recipe gsm8k|ifeval]
    python bench/lora_step_vs_trl.py --quick   # the tiny random model, 16 new tokens, one repetition
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Machine, alternating, median_ratio, missing_package, result_line  # noqa: E402

MAIN = ROOT / "examples" / "reasoning" / "main_grpo.py"
_SHARED = ["runner.sft_steps=0", "runner.prompts_per_step=4", "algorithm.samples_per_prompt=8", "algorithm.kl_beta=0.0",
           "runner.eval_every=1000", "runner.save_every=1000"]
# each recipe's preset and its answer cap; the held-out evaluation (at step 0 and the last) is outside the timed steps
RECIPES = {"gsm8k": (["--config-name", "grpo_smollm2", "data=gsm8k_files", *_SHARED], ["runner.max_new_tokens=200"]),
           "ifeval": (["--config-name", "grpo_ifeval_smollm2", *_SHARED, "data.test_problems=8"], [])}
# Every GRPOConfig setting that matters here, explicit; the comment says where TRL 1.16's default differs.
TRL_SETTINGS = dict(
    per_device_train_batch_size=32,  # 4 prompts x 8 samples per optimizer step (default 8)
    gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,  # one step per generation, as ours
    num_generations=8,
    temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0,
    lr_scheduler_type="constant", warmup_steps=0,  # (default linear); learning_rate is the preset's (default 1e-6)
    optim="adamw_torch_fused", adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, weight_decay=0.0,
    max_grad_norm=1.0,
    beta=0.0,  # no KL term and no reference model, as ours
    epsilon=0.2, epsilon_high=0.2, loss_type="dapo", scale_rewards="group",
    importance_sampling_level="token", mask_truncated_completions=False,
    gradient_checkpointing=False,  # (default True: recomputes the forward; this model fits without it)
    torch_compile=False, use_liger_kernel=False, use_vllm=False, use_transformers_paged=False,
    disable_dropout=True, shuffle_dataset=False, dataloader_num_workers=0,
    use_cpu=True, report_to="none", save_strategy="no", logging_steps=10_000, log_completions=False,
)


def compose(overrides: list[str]):
    """The preset as main_grpo.py composes it, so that the TRL side reads the same data, prompts and reward."""
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema
    from rlinf_like.config.cli import composed
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    return composed(ReasoningConfig, MAIN.parent / "config", overrides[1], overrides[2:])


def require_trl() -> None:
    """Exit naming the install command when TRL's side cannot run: before any repetition or run, not after one."""
    missing = missing_package(("trl", "peft"))
    if missing:
        sys.exit(f"the TRL side needs {missing}: pip install trl==1.16.0 peft")


def peak_rss_gb() -> float:
    """This process's peak resident memory so far (ru_maxrss is in KiB on Linux)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)


def bf16_host() -> bool:
    from rlinf_like.utils.hardware import cpu_bf16_units

    return bool(cpu_bf16_units())


# --- TRL's side, in its own process --------------------------------------------------------------------------------
def trl_side(args) -> None:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from bench.grpo_trl_side import time_generation
    from rlinf_like.data.prompts import PromptFormat
    from rlinf_like.data.sources import load_tasks
    from rlinf_like.hybrid_engines.fsdp.lora import ALL_LINEAR
    from rlinf_like.models import load_tokenizer
    from rlinf_like.workers.reward.fn import REWARD_FNS
    from rlinf_like.workers.reward.worker import reward_info

    torch.set_num_threads(args.threads)
    cfg = compose(RECIPES[args.recipe][0] + args.overrides)
    tok = load_tokenizer(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
    pool = load_tasks(cfg.data).pool
    text = PromptFormat(tok, cfg.data).text  # the prompt exactly as ours sends it (chat template, system prompt)
    rows = [pool[i % len(pool)] for i in range(args.steps * cfg.runner.prompts_per_step)]
    # a row's own fields (IFEval's instruction ids and kwargs) as JSON: Arrow would give every kwargs dict the union
    # of all rows' keys, filled with None, and the checkers would see arguments the row never had
    data = Dataset.from_dict({"prompt": [text(r) for r in rows], "answer": [r.answer for r in rows],
                              "raw_prompt": [r.prompt for r in rows], "fields": [json.dumps(r.fields) for r in rows]})
    fn = REWARD_FNS.get(cfg.reward.fn)

    rewards: list[float] = []  # each generation's mean reward: a learning run's training curve

    # the call our reward worker makes, row by row, with its keyword arguments built the same way (`reward_info`
    # leaves out the row's columns that name a reward argument, such as a file row's `answer`)
    def reward(completions, answer, raw_prompt, fields, **_):
        out = [float(fn(c, a, config=cfg.reward, **reward_info(json.loads(f), p, True, 0))["reward"])
               for c, a, p, f in zip(completions, answer, raw_prompt, fields)]
        rewards.append(sum(out) / len(out))
        return out

    steps: list[float] = []
    generate_s: list[float] = []

    effective: dict = {}

    def dump() -> None:  # after every step: a learning run killed midway keeps the steps it made
        (args.out / "timing.json").write_text(json.dumps({"step_s": steps, "rollout_s": generate_s, "reward": rewards,
                                                           "peak_rss_gb": peak_rss_gb(), "config": effective}))

    class Clock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start = time.perf_counter()

        def on_step_end(self, *_, **__):
            steps.append(time.perf_counter() - self.start)
            dump()

    lora = cfg.actor.lora
    peft_config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                             target_modules=list(lora.target_modules) or ALL_LINEAR, task_type="CAUSAL_LM")
    # a learning run (bench/ifeval_curve_vs_trl.py) keeps the adapter every `save_every` steps, outside the clock
    saving = dict(save_strategy="steps", save_steps=args.save_every, save_only_model=True) if args.save_every else {}
    config = GRPOConfig(output_dir=str(args.out / "trainer"), max_steps=args.steps, seed=args.seed,
                        max_completion_length=cfg.runner.max_new_tokens, bf16=args.bf16, fp16=False,
                        learning_rate=cfg.algorithm.lr, **{**TRL_SETTINGS, **saving})
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                          callbacks=[Clock()], peft_config=peft_config)
    time_generation(trainer, generate_s)
    effective.update({k: str(getattr(config, k)) for k in sorted(TRL_SETTINGS) if k != "report_to"})
    effective.update(bf16=config.bf16, max_completion_length=config.max_completion_length,
                     learning_rate=config.learning_rate,
                     torch_threads=torch.get_num_threads(), lora=str(peft_config.target_modules))
    trainer.train()
    dump()


# --- the parent: both sides, alternated ----------------------------------------------------------------------------
def run_ours(out: Path, args) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    cmd = [sys.executable, str(MAIN), *RECIPES[args.recipe][0], *args.overrides, f"runner.max_steps={args.steps}",
           f"runner.seed={args.seed}", f"runner.output_dir={out}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"ours failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"][1:]
    return {"step_s": [h["step_s"] for h in history], "rollout_s": [h["rollout_s"] for h in history],
            "tokens": [h["response_tokens"] for h in history]}


def run_trl(out: Path, args) -> dict:
    cmd = [sys.executable, __file__, "--side", "trl", "--out", str(out), "--steps", str(args.steps),
           "--seed", str(args.seed), "--threads", str(args.threads), "--recipe", args.recipe,
           *(["--bf16"] if args.bf16 else []),
           "--", *args.overrides]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600,
                          env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    if done.returncode:
        raise RuntimeError(f"TRL failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return json.loads((out / "timing.json").read_text())


def timed(timing: dict) -> tuple[float, float]:
    """A repetition's step time and rollout time: medians over the steps after the warm-up step."""
    rest = slice(1, None) if len(timing["step_s"]) > 1 else slice(None)
    return statistics.median(timing["step_s"][rest]), statistics.median(timing["rollout_s"][rest])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="TRL's torch threads (ours: one thread a process)")
    p.add_argument("--trl-precision", choices=["auto", "fp32", "bf16"], default="auto",
                   help="TRL's precision; auto: bf16 where the CPU has bf16 units, as ours picks")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="gsm8k",
                   help="gsm8k: issue 49's GSM8K-length step; ifeval: issue 50's instruction-following preset")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--side", choices=["trl"], help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--bf16", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--save-every", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="more overrides of the preset, for both sides")
    args = p.parse_args()
    if args.side == "trl":
        return trl_side(args)
    require_trl()
    if args.quick:
        from rlinf_like.models.tiny import write_tiny_model

        tiny = write_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-")))
        args.reps, args.steps = 1, 2
        args.overrides = [f"model.path={tiny}", "runner.max_new_tokens=16", "rollout.max_context=256",
                          *args.overrides]
    else:
        args.overrides = [*RECIPES[args.recipe][1], *args.overrides]
    args.bf16 = bf16_host() if args.trl_precision == "auto" else args.trl_precision == "bf16"
    machine = Machine.start({"reps": args.reps, "steps": args.steps, "seed": args.seed, "trl_threads": args.threads,
                             "trl_precision": "bf16" if args.bf16 else "fp32", "ours_precision": "auto",
                             "recipe": args.recipe, "preset": RECIPES[args.recipe][0] + args.overrides,
                             "trl_settings": TRL_SETTINGS})
    scratch = Path(tempfile.mkdtemp(prefix="lora-step-"))
    detail: dict[str, list] = {"ours": [], "trl": []}

    def measure(side):
        def one(rep: int) -> float:
            out = scratch / f"{side}{rep}"
            timing = (run_ours if side == "ours" else run_trl)(out, args)
            step, rollout = timed(timing)
            detail[side].append({"step_s": timing["step_s"], "rollout_s": timing["rollout_s"]})
            extra = f", response tokens {timing['tokens']}" if "tokens" in timing else ""
            print(f"rep {rep} {side}: steps {[round(s, 1) for s in timing['step_s']]} s, rollout / generation "
                  f"{[round(s, 1) for s in timing['rollout_s']]} s{extra}", flush=True)
            if side == "trl" and rep == 0:
                print("TRL effective config:", json.dumps(timing["config"]), flush=True)
            return step
        return one

    steps = alternating({"ours": measure("ours"), "trl": measure("trl")}, args.reps)
    machine.end()
    rollouts = {side: [timed(d)[1] for d in detail[side]] for side in detail}
    per_rep = [o / t for o, t in zip(steps["ours"], steps["trl"])]
    print(f"step s, medians: ours {statistics.median(steps['ours']):.1f} (rollout "
          f"{statistics.median(rollouts['ours']):.1f}), TRL {statistics.median(steps['trl']):.1f} (generation and "
          f"scoring {statistics.median(rollouts['trl']):.1f})", flush=True)
    print(result_line("lora_step_vs_trl", recipe=args.recipe, step_ratio=median_ratio(steps["ours"], steps["trl"]),
                      rollout_ratio=median_ratio(rollouts["ours"], rollouts["trl"]), per_rep_ratios=per_rep,
                      ours_step_s=steps["ours"], trl_step_s=steps["trl"], reps=args.reps, quick=args.quick))


if __name__ == "__main__":
    main()
