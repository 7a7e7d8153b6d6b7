"""tinker-cookbook's `math_rl` recipe, unmodified, against the Tinker-compatible server in this process on SmolLM2's
first 8 layers: the recipe's own loop, renderer, arithmetic environment and metrics, for two RL steps.
`scripts/setup.sh` installs the cookbook (`scripts/install_tinker_cookbook.sh`).

What it checks holds for any sample: the truncated model's rewards (usually all equal at this size, so the update is
zero) are not asserted; that training moves the weights is tests/test_tinker.py's job."""

import json
import math
import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("tinker")
pytest.importorskip("tinker_cookbook", reason="bash scripts/install_tinker_cookbook.sh installs tinker-cookbook")

from rlinf_like.runtime import Cluster, ClusterConfig  # noqa: E402
from rlinf_like.tinker.server import TinkerServer  # noqa: E402
from rlinf_like.tinker.service import TinkerService, served_names  # noqa: E402

STEPS, GROUPS, GROUP_SIZE = 2, 2, 2
# The server implements importance_sampling, not the recipe's default stable_reinforce (which it refuses by name).
RECIPE = ["env=arithmetic", "loss_fn=importance_sampling", f"group_size={GROUP_SIZE}", f"groups_per_batch={GROUPS}",
          "lora_rank=4", "learning_rate=1e-3", "max_tokens=4", f"max_steps={STEPS}", "eval_every=0", "save_every=0",
          "renderer_name=qwen3_instruct"]


def run_recipe(command: list[str], env: dict, timeout_s: float = 180.0) -> subprocess.CompletedProcess:
    """The recipe's process; one that outlives `timeout_s` (it takes ~20 s) gets SIGABRT, so that faulthandler
    prints where each of its threads waits into the failure instead of the test timing out with nothing."""
    process = subprocess.Popen(command, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        out, err = process.communicate()
        err = f"{err}\n[the recipe did not end within {timeout_s:.0f} s; its threads above]"
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def test_math_rl_runs_unmodified_against_the_server(real_model_8l_path, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_API_KEY": "tml-test"}
    service_out = tmp_path / "server"
    with Cluster(ClusterConfig(backend="local", num_cpus=1)) as cluster:
        service = TinkerService(real_model_8l_path, served_names(real_model_8l_path), service_out, cluster)
        server = TinkerServer(service)
        server.start()
        try:
            done = run_recipe([sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
                               f"model_name={real_model_8l_path}", f"base_url={server.base_url}", *RECIPE,
                               f"log_path={tmp_path / 'recipe'}"], env)
            assert done.returncode == 0, f"the recipe failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
            optim = service.futures.of_kind("optim")
            fwdbwd = service.futures.of_kind("fwdbwd")
            samples = service.futures.of_kind("sample")
        finally:
            server.close()
    rows = [json.loads(line) for line in (tmp_path / "recipe" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "env/all/reward/total" in r]
    assert [r["progress/batch"] for r in steps] == list(range(STEPS)), rows
    assert all(math.isfinite(r["env/all/reward/total"]) for r in steps)
    # The recipe's own check of the protocol: the logprobs the sampler returned and those forward_backward computed
    # for the same tokens under the same weights agree (fp32 both; a shifted target or a stale sampler breaks it).
    assert all(abs(r["optim/kl_sample_train_v1"]) < 1e-4 and r["optim/kl_sample_train_v2"] < 1e-6 for r in steps), \
        [(r["optim/kl_sample_train_v1"], r["optim/kl_sample_train_v2"]) for r in steps]
    # What the server did for them: one optimizer step a recipe step after its forward_backward, every one
    # succeeded; the recipe asks for each group member's completion on its own.
    assert len(optim) == STEPS and all(f.exception() is None for f in optim)
    assert len(fwdbwd) >= STEPS and all(f.exception() is None for f in fwdbwd)
    assert len(samples) == STEPS * GROUPS * GROUP_SIZE
