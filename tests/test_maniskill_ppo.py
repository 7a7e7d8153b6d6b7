"""Embodied PPO on ManiSkill3 PickCube-v1 through the hydra example (`env=maniskill_pickcube`), CI-sized: two
updates of 4 envs x 25 steps, run sequentially and in pipeline mode (2 stages of 2 envs) side by side; the
pipelined run must see the sequential run's episodes and losses. Skips, naming the install step, without
mani-skill or a Vulkan driver for SAPIEN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlinf_like.envs.vulkan import INSTALL_HINT

pytest.importorskip("mani_skill", reason=f"mani-skill is not installed: {INSTALL_HINT}")

ROOT = Path(__file__).resolve().parents[1]
# 4 envs: 2 per pipeline stage. With 1 env per stage the pipelined run draws its Gaussian action noise 8 values at
# a time and the sequential run 16, and torch's CPU normal_ takes another algorithm below 16 values: other actions.
ARGS = ["env=maniskill_pickcube", "env.num_envs=4", "runner.steps_per_rollout=25", "runner.total_env_steps=200",
        "algorithm.ppo.mini_batches=2"]


def vulkan_ok() -> str | None:
    """None when SAPIEN can build PickCube here, else why not (checked in a child: SAPIEN keeps its first device)."""
    code = ("from rlinf_like.envs.maniskill import ManiSkillEnv\n"
            "try:\n    ManiSkillEnv('PickCube-v1', 1, sim_backend='physx_cpu')\n"
            "except RuntimeError as err:\n    print(err)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}, timeout=300)
    return out.stdout.strip() or None


@pytest.mark.slow
def test_ppo_runs_on_pickcube_sequential_and_pipelined(tmp_path):
    why = vulkan_ok()
    if why:
        pytest.skip(why)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    main = ROOT / "examples" / "embodied" / "main_embodied.py"
    procs = {}
    for name, extra in (("seq", []), ("pipe", ["runner.pipeline=true"])):
        log = open(tmp_path / f"{name}.log", "w")
        procs[name] = subprocess.Popen([sys.executable, str(main), *ARGS, *extra, f"runner.output_dir={tmp_path / name}"],
                                       stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
        for name, proc in procs.items():
            assert proc.wait(400) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    seq, pipe = ([h for h in json.loads((tmp_path / n / "checkpoint" / "runner.json").read_text())["history"]]
                 for n in ("seq", "pipe"))
    assert [h["iteration"] for h in seq] == [1, 2] == [h["iteration"] for h in pipe]
    assert seq[-1]["env_steps"] == 200
    # PickCube's episodes last 50 steps: the second update ends the first episodes (dense reward, no success yet)
    assert seq[-1]["episode_return"] > 0 and seq[-1]["success_rate"] == 0.0
    assert "episode_return" not in seq[0]  # no episode ends in the first 25 steps
    for a, b in zip(pipe, seq):  # same seeds, same sampling order: the same episodes and losses
        assert ("episode_return" in a) == ("episode_return" in b)
        if "episode_return" in b:
            assert a["episode_return"] == pytest.approx(b["episode_return"], rel=1e-6)
        assert a["value_loss"] == pytest.approx(b["value_loss"], rel=1e-4)
