"""Wall time to the same held-out accuracy: our GRPO runner versus TRL's GRPOTrainer, per seed, alternating.

Both sides start from one warm start, made by the runner's own SFT (`ReasoningRun`, collocated preset) and
exported as an HF checkpoint. Same task, same held-out set, same GRPO settings (32 prompts x 8 samples per
optimizer step, lr 2e-4 constant, clip 0.2, group std scaling, token-level loss, grad-norm clip 1.0,
28 new tokens at temperature 1; no KL term, so neither side loads a reference model; the PPO ratio's old
logprobs are the rollout engine's on ours, the detached current ones on TRL's, no recompute on either side).
Ours runs `--schedule`: collocated (default: FSDP dp=2 and two native-engine replicas taking turns on both
slots, one thread per process) or async (the actor on slot 0, one native-engine replica serving on slot 1: the
rollout of step k+1 runs while step k trains, at most one version stale, the PPO ratio taken against the
behaviour logprobs the rollout recorded); TRL 1.16 runs in its own process in fp32 with 2 threads and every
differing default set (`bench/grpo_trl_side.py`, which prints its effective config). Each side's per-step phases
are printed: ours rollout / reward / train (onload, advantages, update) / weight sync, TRL generation with
scoring / the rest of its step (training).

Clocks: both start after the model is loaded and the workers / trainer are built, and stop at each step's
end (ours: after the weight sync; TRL: after the optimizer step, its generation uses the trained model
itself). At every evaluation step each side writes its weights out, outside its clock; after all runs ONE
function (`held_out_accuracy`: HF greedy decoding, the reward function's `correct`) scores every snapshot.
The target is the warm start's accuracy + `--gain`; a side that never reaches it counts its whole time (the
ratio is then a bound, and says so). Sides alternate (ours first on even seeds); time_ratio is
median(ours) / median(TRL) over the seeds.

    python bench/grpo_vs_trl.py --quick
    python bench/grpo_vs_trl.py [--seeds 3] [--steps 60] [--schedule collocated|async]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rlinf_like.data.config import DataConfig  # noqa: E402
from rlinf_like.data.prompts import PromptFormat  # noqa: E402
from rlinf_like.models import load_tokenizer  # noqa: E402
from rlinf_like.workers.reward import score  # noqa: E402

# What each schedule choice adds to the collocated preset (examples/reasoning/config/grpo_collocated.yaml).
SCHEDULES = {
    "collocated": [],
    "async": ["runner.schedule=async", "runner.max_staleness=1", "cluster.component_placement.actor=0",
              "cluster.component_placement.rollout=1", "cluster.component_placement.reward=1"],
}
# kl_beta 0 as TRL's beta (default 0.0 there too): neither side loads a reference model. The old logprobs are the
# rollout engine's (no trainer recompute), as TRL takes them from the same forward when it is on-policy.
COMMON = ["runner.prompts_per_step=32", "algorithm.samples_per_prompt=8", "algorithm.lr=2e-4", "rollout.engine=native",
          "algorithm.kl_beta=0.0", "algorithm.recompute_logprobs=false"]
PHASES = ("rollout_s", "reward_s", "train_s", "sync_s")  # ours, per step (train_s: onload + advantages + update)


def compose_cfg(overrides: list[str]):
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema, structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    with initialize_config_dir(str(ROOT / "examples" / "reasoning" / "config"), version_base="1.3"):
        return structure(ReasoningConfig, compose("grpo_collocated", [*COMMON, *overrides]))


def warm_start(root: Path, sft_steps: int, warm: Path) -> None:
    """The runner's own SFT warm start (ReasoningRun enters: workers, SFT, its eval), exported as HF. With 0 SFT
    steps (--quick) the runner's initial weights, as it writes them before any worker starts."""
    import shutil

    from rlinf_like.runners.reasoning.run import ReasoningRun, model_path

    cfg = compose_cfg([f"runner.sft_steps={sft_steps}", f"runner.output_dir={root / 'sft'}"])
    if sft_steps == 0:  # a smoke run: no workers to start (~25 s) for the weights the runner would start from
        shutil.copytree(model_path(cfg, root / "sft"), warm)
        print("warm start: the runner's initial weights (0 SFT steps)", flush=True)
        return
    with ReasoningRun(cfg) as run:
        run.workers.actor.export_hf(str(warm)).wait()
        load_tokenizer(run.model_path).save_pretrained(warm)
        print(f"warm start: {sft_steps} SFT steps, the runner's own eval {run.history[0]['eval_accuracy']:.3f}",
              flush=True)


def run_ours(warm: Path, out: Path, schedule: str, seed: int, steps: int,
             eval_every: int) -> tuple[list[float], dict[str, float]]:
    """GRPO seconds so far after each step and the median seconds of each phase; the weights at each evaluation
    step under `out/step_<n>`."""
    from rlinf_like.runners.reasoning import train
    from rlinf_like.runners.reasoning.run import ReasoningRun

    def snapshot(run: ReasoningRun) -> dict[str, float]:  # in place of the runner's eval, outside its clock
        run.workers.actor.export_hf(str(out / f"step_{run.step}")).wait()
        return {"eval_accuracy": float("nan"), "eval_format_rate": float("nan")}

    cfg = compose_cfg([*SCHEDULES[schedule], f"model.path={warm}", "runner.sft_steps=0", f"runner.seed={seed}",
                       f"runner.max_steps={steps}", f"runner.eval_every={eval_every}", "runner.save_every=100000",
                       f"runner.output_dir={out / 'run'}"])
    evaluate, ReasoningRun.evaluate = ReasoningRun.evaluate, snapshot
    try:
        history = train(cfg).history
    finally:
        ReasoningRun.evaluate = evaluate
    steps_done = [h for h in history if "elapsed_s" in h]
    return [h["elapsed_s"] for h in steps_done], {k: statistics.median(h[k] for h in steps_done) for k in PHASES}


def run_trl(warm: Path, out: Path, seed: int, steps: int, eval_every: int) -> tuple[list[float], dict, dict]:
    cmd = [sys.executable, str(ROOT / "bench" / "grpo_trl_side.py"), f"--warm={warm}", f"--out={out}",
           f"--seed={seed}", f"--steps={steps}", f"--eval-every={eval_every}", "--threads=2"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"TRL failed:\n{done.stderr[-3000:]}")
    timing = json.loads((out / "timing.json").read_text())
    steps_s = [b - a for a, b in zip([0.0, *timing["elapsed_s"]], timing["elapsed_s"])]
    gen = statistics.median(timing["generate_s"])
    profile = {"generate_and_score_s": gen, "train_s": statistics.median(steps_s) - gen}
    return timing["elapsed_s"], timing["config"], profile


@torch.inference_mode()
def held_out_accuracy(weights: Path, tok, max_new_tokens: int = 28) -> float:
    """THE evaluation of both sides: greedy HF decoding of the held-out set, scored by the reward function."""
    from transformers import AutoModelForCausalLM

    from rlinf_like.data.sources import load_tasks

    test = load_tasks(DataConfig()).test
    prompt_ids = PromptFormat(tok, DataConfig()).prompt_ids
    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
    prompts = [prompt_ids(p) for p in test]
    width = max(map(len, prompts))
    ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(score(t, p.answer, True, 1).correct for t, p in zip(texts, test)) / len(test)


def curve(out: Path, elapsed: list[float], warm: Path, tok) -> list[tuple[int, float, float]]:
    """(step, GRPO seconds, held-out accuracy) at the warm start and each snapshot."""
    points = [(0, 0.0, held_out_accuracy(warm, tok))]
    for snap in sorted(out.glob("step_*"), key=lambda p: int(p.name.split("_")[1])):
        step = int(snap.name.split("_")[1])
        if step > 0:
            points.append((step, elapsed[step - 1], held_out_accuracy(snap, tok)))
    return points


def time_to(points: list[tuple[int, float, float]], target: float) -> tuple[float, bool]:
    for _, elapsed, acc in points:
        if acc >= target - 1e-9:  # accuracies are k / n: compare without float noise
            return elapsed, True
    return points[-1][1], False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="1 seed, 4 steps, no SFT (the initial weights): a smoke run")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--sft-steps", type=int, default=300)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="collocated")
    p.add_argument("--gain", type=float, default=0.1, help="target = warm-start accuracy + gain")
    p.add_argument("--warm-dir", type=Path, help="the warm start: reused when it holds one, else made there")
    p.add_argument("--warm-only", action="store_true", help="make the warm start in --warm-dir and stop")
    args = p.parse_args()
    if args.quick:
        args.seeds, args.steps, args.eval_every, args.sft_steps = 1, 4, 4, 0
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; torch "
          f"{torch.__version__}; ours: schedule {args.schedule} {SCHEDULES[args.schedule]} {COMMON}; "
          f"{args.seeds} seeds x {args.steps} steps, eval every {args.eval_every}", flush=True)
    runs: dict[str, list] = {"ours": [], "TRL": []}
    profiles: dict[str, list[dict[str, float]]] = {"ours": [], "TRL": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        warm = args.warm_dir or root / "warm"
        if (warm / "config.json").exists():
            print(f"warm start: reused from {warm}", flush=True)
        else:
            warm_start(root, args.sft_steps, warm)
        if args.warm_only:
            return
        trl_config = None
        for seed in range(args.seeds):
            sides = ["ours", "TRL"] if seed % 2 == 0 else ["TRL", "ours"]
            for side in sides:
                out = root / f"{side}_{seed}"
                if side == "ours":
                    elapsed, profile = run_ours(warm, out, args.schedule, seed, args.steps, args.eval_every)
                else:
                    elapsed, trl_config, profile = run_trl(warm, out, seed, args.steps, args.eval_every)
                runs[side].append((seed, out, elapsed))
                profiles[side].append(profile)
                print(f"seed {seed} {side}: {elapsed[-1]:.1f} s for {len(elapsed)} steps "
                      f"({statistics.median(b - a for a, b in zip([0.0, *elapsed], elapsed)):.2f} s/step median; "
                      f"phases {fmt(profile)}), load {os.getloadavg()[0]:.2f}", flush=True)
        print(f"TRL effective config: {json.dumps(trl_config)}")
        print(f"load average {os.getloadavg()[0]:.2f} after training (the evaluations follow, untimed)", flush=True)
        tok = load_tokenizer(warm)
        curves = {side: [(seed, curve(out, elapsed, warm, tok)) for seed, out, elapsed in rs]
                  for side, rs in runs.items()}
    start = curves["ours"][0][1][0][2]
    target = start + args.gain
    print(f"warm start held-out accuracy {start:.3f}; target {target:.3f}")
    times: dict[str, list[float]] = {}
    reached: dict[str, bool] = {}
    for side, cs in curves.items():
        for seed, points in cs:
            t, hit = time_to(points, target)
            times.setdefault(side, []).append(t)
            reached[side] = reached.get(side, True) and hit
            print(f"{side:>5} seed {seed}: {t:6.1f} s to target{'' if hit else ' (not reached: whole run)'}; "
                  + "  ".join(f"{s}/{e:.0f}s:{a:.3f}" for s, e, a in points))
    medians = {side: statistics.median(ts) for side, ts in times.items()}
    final = {side: statistics.median(points[-1][2] for _, points in cs) for side, cs in curves.items()}
    phases = {side: {k: statistics.median(p[k] for p in ps) for k in ps[0]} for side, ps in profiles.items()}
    print(f"per-step phases (medians over seeds of per-step medians): ours {fmt(phases['ours'])}; "
          f"TRL {fmt(phases['TRL'])}; final held-out accuracy ours {final['ours']:.3f}, TRL {final['TRL']:.3f}")
    per_step = {side: statistics.median(e[-1] / len(e) for _, _, e in rs) for side, rs in runs.items()}
    ratio = medians["ours"] / medians["TRL"]
    print(f"median time to target: ours {medians['ours']:.1f} s, TRL {medians['TRL']:.1f} s; per step ours "
          f"{per_step['ours']:.2f} s, TRL {per_step['TRL']:.2f} s; load average {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"bench": "grpo_vs_trl", "time_ratio": round(ratio, 3),
                      "per_step_ratio": round(per_step["ours"] / per_step["TRL"], 3), "schedule": args.schedule,
                      "engine": "native", "seeds": args.seeds, "steps": args.steps, "target_accuracy": round(target, 3),
                      "ours_reached": reached["ours"], "trl_reached": reached["TRL"],
                      "final_accuracy_ours": final["ours"], "final_accuracy_trl": final["TRL"]}))


def fmt(profile: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.3f}" for k, v in profile.items())


if __name__ == "__main__":
    main()
