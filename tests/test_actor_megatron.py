"""The actor worker on the Megatron backend: a 2-rank ActorWorker group with backend=megatron, TP=2
and a 1-rank FSDP one (both one data-parallel replica, so the same rows and micro-batches) take the
same RL step from the same HF checkpoint: their trainer logprobs, RL metrics and exported weights
agree; the weight sync from the Megatron actor gives a native rollout exactly its exported weights;
bad `actor.*` values are refused by name before launch."""

import importlib.util

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.actor_setup import actor_config, actor_replicas
from rlinf_like.runners.config import ReasoningConfig
from rlinf_like.runners.reasoning import check_config
from rlinf_like.workers.actor.loss import LossConfig
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker, check_actor_config
from rlinf_like.workers.rollout.worker import RolloutWorker
from rlinf_like.workers.training import LoopConfig

# a spec lookup, not an import: the FSDP and rollout workers need no megatron
needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")

SPEC = TinyModelSpec(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     init_std=0.05)
LR = 1e-3


def rl_batch() -> dict:
    """8 rows of random prompts / responses with mixed-sign advantages and rollout logprobs near the
    model's (so the clipped ratio is active on some tokens)."""
    g = torch.Generator().manual_seed(0)
    lengths = [(3, 5), (4, 3), (2, 6), (5, 4), (3, 3), (4, 6), (2, 2), (5, 5)]
    prompts = [torch.randint(4, 100, (p,), generator=g).tolist() for p, _ in lengths]
    responses = [torch.randint(4, 100, (r,), generator=g).tolist() for _, r in lengths]
    logprobs = [(-4.6 + 0.3 * torch.randn(r, generator=g)).tolist() for _, r in lengths]
    advantages = torch.randn(len(lengths), generator=g).tolist()
    return build_rl_batch(prompts, responses, logprobs, advantages)


class InspectedRollout(RolloutWorker):
    def weights(self) -> dict[str, torch.Tensor]:
        return {n: t.clone() for n, t in self.engine.weight_tensors().items()}


def load(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@needs_megatron
def test_megatron_tp2_actor_steps_like_fsdp_and_syncs_its_exported_weights(cluster, tmp_path):
    from rlinf_like.hybrid_engines.fsdp import FSDPConfig
    from rlinf_like.hybrid_engines.megatron import MegatronConfig
    from rlinf_like.hybrid_engines.reshard import SyncPlan
    from rlinf_like.scheduler import connect_groups, wait_all
    from rlinf_like.workers.rollout.engine import RolloutConfig

    path = str(write_tiny_model(tmp_path / "qwen2", SPEC))
    optim = OptimConfig(lr=1e-2)  # set_lr below switches it to LR, as the runner does after SFT
    loop = LoopConfig(micro_batch_size=4)  # two accumulated micro-batches per optimizer step
    loss = LossConfig(entropy_coef=0.01, temperature=0.9)
    configs = {"fsdp": ActorConfig(path, FSDPConfig(optim=optim), loss, loop),
               "megatron": ActorConfig(path, loss=loss, loop=loop, backend="megatron",
                                       megatron=MegatronConfig(tensor_parallel=2, optim=optim))}
    placement = cluster.place({"am_megatron": "0-1", "am_fsdp": "0", "am_rollout": "0"})
    actors = {name: ActorWorker.create_group(cfg).launch(cluster, placement, f"am_{name}")
              for name, cfg in configs.items()}
    rollout = InspectedRollout.create_group(RolloutConfig(model_path=path, max_batch_size=2)).launch(
        cluster, placement, "am_rollout")
    try:
        megatron = actors["megatron"]
        assert [(d.rank, d.size, d.first) for d in megatron.data_parallel().wait()] == [(0, 1, True), (0, 1, False)]
        batch = rl_batch()
        wait_all([a.set_lr(LR) for a in actors.values()])
        # offload / onload through the worker's verbs, then the trainer logprobs: each row once
        megatron.offload().wait()
        megatron.onload().wait()
        logprobs = {name: a.compute_logprobs(batch).wait() for name, a in actors.items()}
        assert logprobs["megatron"][1].shape[0] == 0  # the replica's second rank returns no rows
        torch.testing.assert_close(torch.cat(logprobs["megatron"]), logprobs["fsdp"][0], rtol=1e-5, atol=1e-5)
        metrics = {name: a.train_step(batch).wait(timeout=120) for name, a in actors.items()}
        for name, a in actors.items():
            a.export_hf(str(tmp_path / name)).wait()

        # the weight sync: Megatron's TP shards into a one-rank native engine give the exported weights
        connect_groups(megatron, rollout, "am_weights")
        [src] = megatron.on_ranks(0).weight_layouts().wait()
        [dst] = rollout.on_ranks(0).weight_layouts().wait()
        plan = SyncPlan.build(src, dst, megatron.name, rollout.name, bucket_bytes=16 << 10)
        wait_all([megatron.connect_weights("am_weights", plan), rollout.connect_weights("am_weights", plan)])
        wait_all([megatron.publish_weights(1), rollout.apply_weights(1)], timeout=60)
        synced = rollout.weights().wait()[0]
    finally:
        for group in [*actors.values(), rollout]:
            group.shutdown()

    fsdp, mg = metrics["fsdp"][0], metrics["megatron"][0]
    assert metrics["megatron"][1] == pytest.approx(mg, rel=1e-6)  # both TP ranks report the replica's step
    assert mg["lr"] == LR and fsdp["lr"] == LR and mg["skipped"] == 0.0
    assert set(mg) >= {"loss", "policy_loss", "entropy", "grad_norm"} and set(fsdp) <= set(mg)
    for key in fsdp:  # fp32 on both: only the reduction order differs (TP splits the matmuls' sums)
        assert mg[key] == pytest.approx(fsdp[key], rel=1e-5, abs=1e-6), key

    initial, exported = load(tmp_path / "qwen2"), {name: load(tmp_path / name) for name in actors}
    assert exported["megatron"].keys() == exported["fsdp"].keys() == initial.keys()
    for key, value in exported["megatron"].items():
        moved = (exported["fsdp"][key] - initial[key]).abs()
        # Adam's first step moves each weight by ~LR * sign(grad); TP's fp32 summation order changes a
        # gradient by ~1e-7 relative, which moves the step only where |grad| is near Adam's eps
        torch.testing.assert_close(value, exported["fsdp"][key], rtol=0, atol=LR * 1e-2, msg=key)
        assert moved.max() > 0.5 * LR, key  # the step trained every tensor: the comparison is not of constants
        assert torch.equal(synced[key], value), key  # the sync is exact: same floats as the export


def test_bad_actor_values_are_refused_by_name():
    def config(**sections):
        cfg = ReasoningConfig()
        for dotted, value in sections.items():
            section, key = dotted.split("__")
            setattr(getattr(cfg, section), key, value)
        return cfg

    cases = [({"actor__backend": "deepspeed"}, r"actor.backend='deepspeed' is not one of \['fsdp', 'megatron'\]"),
             ({"actor__tp_size": 2}, r"actor.tp_size=2 must be >= 1, and > 1 only with actor.backend=megatron"),
             ({"actor__backend": "megatron", "actor__pp_size": 0}, r"actor.pp_size=0 must be >= 1"),
             ({"actor__backend": "megatron", "runner__schedule": "dynamic"},
              r"runner.schedule=dynamic needs actor.backend=fsdp"),
             ({"actor__backend": "megatron", "actor__pp_size": 2, "runner__pack_sequences": True},
              r"runner.pack_sequences=true needs actor.pp_size=1 with actor.backend=megatron")]
    for sections, message in cases:
        with pytest.raises(ValueError, match=message):
            check_config(config(**sections))
    # placement-dependent: TP x PP must divide the actor's ranks, the rest are data-parallel replicas
    cfg = config(actor__backend="megatron", actor__tp_size=2, actor__pp_size=2)
    assert actor_replicas(cfg, 8) == 2
    with pytest.raises(ValueError, match=r"actor.tp_size x actor.pp_size = 2 x 2 must divide the actor's 6 ranks"):
        actor_replicas(cfg, 6)
    # the runner's actor config carries the sizes and the same optimizer for either backend
    built = actor_config(cfg, "model", LossConfig(), LoopConfig())
    assert (built.backend, built.megatron.tensor_parallel, built.megatron.pipeline_parallel) == ("megatron", 2, 2)
    assert built.megatron.optim == built.fsdp.optim and built.fsdp.optim.lr == cfg.algorithm.lr
    with pytest.raises(ValueError, match=r"actor.backend='jax' is not one of"):
        check_actor_config(ActorConfig(backend="jax"))
