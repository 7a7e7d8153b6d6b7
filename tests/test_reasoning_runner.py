"""The reasoning runner end to end, through the hydra example as a user runs it (subprocesses:
each run starts its own local Ray). The pipelined PPO run (KL, critic, token budget) is asserted on
the two-node run in test_multinode.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlinf_like.runners.config import ReasoningConfig, RunnerConfig
from rlinf_like.runners.phases import make_requests
from rlinf_like.runners.reasoning import check_config, load_tasks

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "examples" / "reasoning" / "main_grpo.py"
REWARD_GAIN = 0.05  # measured +0.10 (0.53 -> 0.63) for this seed; half of it, so only a run that does not learn fails
COLLOCATED = ["runner.save_every=15", "runner.eval_every=15"]


def run_main(*overrides, timeout=400):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run([sys.executable, str(MAIN), *overrides], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)


def history(out: Path) -> list[dict]:
    return json.loads((out / "checkpoint" / "runner.json").read_text())["history"]


@pytest.mark.timeout(900)  # ~2.5 min on a quiet 2-core machine; the bound is for a heavily shared one
def test_collocated_grpo_raises_reward_checkpoints_exports_and_resumes(tmp_path):
    """The default preset, shortened: SFT warm-start, 30 GRPO steps; reward must go up. The 30 steps run
    as 15, then a resumed run to 30 (instead of 30, then a separate 2-step resumed run): the resumed half
    continues the committed history, and the reward is judged over both halves."""
    out = tmp_path / "run"
    first = run_main(*COLLOCATED, "runner.max_steps=15", f"runner.output_dir={out}", timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "placement mode" in first.stdout and (out / "curves.png").stat().st_size > 0
    before = history(out)
    assert [h["step"] for h in before] == list(range(16))
    assert before[0]["eval_accuracy"] > 0.1  # the SFT warm-start gives GRPO something to work with

    resumed = run_main(*COLLOCATED, "runner.max_steps=30", f"runner.output_dir={out}", "runner.resume=true",
                       timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed at step 15" in resumed.stdout
    after = history(out)
    assert after[:16] == before and [h["step"] for h in after] == list(range(31))  # the curve continues
    rewards = [h["reward"] for h in after[1:]]
    early, late = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert late > early + REWARD_GAIN, f"mean reward {early:.3f} over steps 1-10, {late:.3f} over 21-30"
    assert all(h["staleness"] == 0.0 for h in after[1:])  # collocated: always on-policy
    assert {"reward", "loss", "entropy", "grad_norm", "rollout_tokens_per_s"} <= set(after[1])
    assert {"reward", "loss", "entropy", "grad_norm", "rollout_tokens_per_s"} <= set(after[16])

    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(out / "final_model").state_dict()
    init = AutoModelForCausalLM.from_pretrained(out / "init_model").state_dict()
    assert any(not torch.equal(final[n], init[n]) for n in init)  # SFT + GRPO changed the weights


def test_a_wrong_key_fails_before_any_worker_starts():
    result = run_main("runner.max_stepz=3", timeout=60)
    assert result.returncode != 0
    assert "unknown config key 'runner.max_stepz'" in result.stderr and "did you mean 'runner.max_steps'" in result.stderr
    assert "placement mode" not in result.stdout  # no cluster was started


def test_bad_values_are_named_before_launch(tmp_path):
    cfg = ReasoningConfig(runner=RunnerConfig(output_dir=str(tmp_path)))
    cfg.algorithm.advantage = "gpro"
    with pytest.raises(ValueError, match=r"algorithm.advantage='gpro' is not one of \['gae', 'grpo', 'reinforce_pp', 'rloo'\]"):
        check_config(cfg)


def test_data_order_depends_only_on_the_step(tmp_path):
    cfg = ReasoningConfig(runner=RunnerConfig(output_dir=str(tmp_path)))
    a, b = load_tasks(cfg.data), load_tasks(cfg.data)

    def requests(tasks, step):
        return make_requests(cfg, tasks, step, lambda p: [ord(c) for c in p.prompt])

    assert requests(a, 5) == requests(b, 5)  # what a resumed run draws at step 5
    assert requests(a, 5)[0] != requests(a, 6)[0]
    held_out = {p.prompt for p in a.test}
    assert not any(p.prompt in held_out for p in a.pool)
