"""A NaN reaching the loss never reaches the weights: the actor (two FSDP ranks) skips that optimizer
step, and the runner's policy either logs it or stops naming the values."""

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning import check_finite
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker

def rl_batch(advantage: float):
    prompts, responses = [[5, 6, 7], [8, 9], [4, 5], [6, 7, 8]], [[10, 11], [12, 13, 14], [15], [16, 17]]
    return build_rl_batch(prompts, responses, [[-1.0] * len(r) for r in responses], [advantage] * 4)

def test_nan_advantages_skip_the_step_and_leave_weights_unchanged(cluster, tmp_path):
    path = write_tiny_model(tmp_path / "model", TinyModelSpec())
    config = ActorConfig(model_path=str(path), fsdp=FSDPConfig(optim=OptimConfig(lr=1e-2)))
    actor = ActorWorker.create_group(config).launch(cluster, cluster.place({"actor": "0-1"}), "actor")
    try:
        actor.export_hf(str(tmp_path / "before")).wait()
        bad = actor.train_step(rl_batch(float("nan"))).wait(timeout=120)
        assert all(m["skipped"] == 1.0 for m in bad), bad  # every rank agrees: the step was dropped
        actor.export_hf(str(tmp_path / "after_nan")).wait()
        good = actor.train_step(rl_batch(1.0)).wait(timeout=120)
        assert all(m["skipped"] == 0.0 for m in good)
        actor.export_hf(str(tmp_path / "after_good")).wait()
    finally:
        actor.shutdown()
    from safetensors.torch import load_file

    load = lambda name: load_file(str(tmp_path / name / "model.safetensors"))  # noqa: E731
    initial, after_nan, after_good = load("before"), load("after_nan"), load("after_good")
    assert all(torch.equal(initial[k], after_nan[k]) for k in initial)  # bit-identical: nothing applied
    assert any(not torch.equal(initial[k], after_good[k]) for k in initial)  # a finite step does train

def test_the_runner_policy_logs_or_stops_naming_the_values():
    fine = {"loss": 0.3, "grad_norm": 1.2, "skipped": 0.0}
    assert check_finite(fine, 7, "stop") is None
    bad = {"loss": float("nan"), "grad_norm": float("nan"), "skipped": 1.0}
    assert "step 7: non-finite loss or gradient norm (loss=nan, grad_norm=nan)" in check_finite(bad, 7, "skip")
    with pytest.raises(RuntimeError, match=r"step 7: .*weights unchanged; stopping \(runner.nonfinite=stop\)"):
        check_finite(bad, 7, "stop")
    critic_bad = {"loss": 0.1, "grad_norm": 0.5, "skipped": 0.0, "critic_skipped": 0.5, "value_loss": float("inf")}
    assert "value_loss=inf" in check_finite(critic_bad, 3, "skip")
