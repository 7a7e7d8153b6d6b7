"""The actor worker on the Megatron backend: a 2-rank ActorWorker group with backend=megatron, TP=2
(one data-parallel replica: both ranks train on every row) takes an RL step like the one-rank FSDP
actor, which in fp32 is a plain HF module under AdamW, here run in the test process through the
same loop planner and loss: trainer logprobs, RL metrics and exported weights agree; the weight sync
from the Megatron actor gives a native rollout exactly its exported weights; bad `actor.*` values
are refused by name before launch. (One worker group fewer than an FSDP group would cost: the
suite's time budget.)"""

import importlib.util

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_logprobs
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.actor_setup import actor_config, actor_replicas
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning import check_config
from rlinf_like.workers.actor.loss import LossConfig, LossTerms, rl_loss
from rlinf_like.workers.actor.worker import ActorConfig, ActorWorker, check_actor_config
from rlinf_like.workers.inference.worker import InferenceWorker
from rlinf_like.workers.rollout.worker import RolloutWorker
from rlinf_like.training.loop import LoopConfig, plan_steps

# a spec lookup, not an import: the FSDP and rollout workers need no megatron
needs_megatron = pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")

SPEC = TinyModelSpec(arch="qwen2", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                     init_std=0.05)
LR = 1e-3
EPS = 1e-6  # Adam's eps: its first step, ~LR * g / (|g| + eps), would blow float noise in a tiny g up to ~LR


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


def one_rank_step(path: str, batch: dict, loop: LoopConfig, loss: LossConfig, terms: LossTerms, clip: float):
    """What the one-rank FSDP actor does in fp32 (a plain module, no sharding): this rank's plan from
    `plan_steps`, the RL loss, clipped AdamW. Returns (logprobs before, averaged metrics, weights)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        logprobs = token_logprobs(model.eval(), batch, terms.temperature)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS, weight_decay=0.0)
    metrics: dict[str, float] = {}
    [micros] = plan_steps(batch, 0, 1, loop, step=0)
    for micro, scale in micros:
        value, m = rl_loss(loss, terms)(model, micro)
        (value * scale).backward()
        for k, v in {"loss": value.item(), **m}.items():
            metrics[k] = metrics.get(k, 0.0) + v / len(micros)
    metrics["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    optimizer.step()
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return logprobs, metrics, weights


def load(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@pytest.mark.extended  # the Megatron manager's TP/PP/DP training and its exact sync: test_megatron_manager.py
@needs_megatron
def test_megatron_tp2_actor_steps_like_fsdp_and_syncs_its_exported_weights(cluster, tmp_path):
    from rlinf_like.hybrid_engines.megatron import MegatronConfig
    from rlinf_like.hybrid_engines.reshard import SyncPlan
    from rlinf_like.runtime import connect_groups, wait_all
    from rlinf_like.workers.rollout.engine import RolloutConfig

    path = str(write_tiny_model(tmp_path / "qwen2", SPEC))
    optim = OptimConfig(lr=1e-2, eps=EPS)  # set_lr below switches it to LR, as the runner does after SFT
    loop = LoopConfig(micro_batch_size=4)  # two accumulated micro-batches per optimizer step
    loss, terms = LossConfig(entropy_coef=0.01), LossTerms(temperature=0.9)
    config = ActorConfig(model_path=path, loss=loss, loss_terms=terms, loop=loop, backend="megatron",
                         megatron=MegatronConfig(tensor_parallel=2, optim=optim))
    placement = cluster.place({"am_actor": "0-1", "am_rollout": "0", "am_reference": "0-1"})
    actor = ActorWorker.create_group(config).launch(cluster, placement, "am_actor")
    rollout = InspectedRollout.create_group(RolloutConfig(model_path=path, max_batch_size=2, dtype="float32")).launch(
        cluster, placement, "am_rollout")
    # the KL reference on the actor's backend and split (as the runner launches it with actor.backend=megatron)
    reference = InferenceWorker.create_group(path, None, terms.temperature, megatron=config.megatron).launch(
        cluster, placement, "am_reference")
    batch = rl_batch()
    try:
        ref_before = reference.compute_logprobs(batch).wait()
        reference.offload().wait()
        reference.onload().wait()
        assert [(d.rank, d.size, d.first) for d in actor.data_parallel().wait()] == [(0, 1, True), (0, 1, False)]
        actor.set_lr(LR).wait()
        actor.offload().wait()  # through the worker's verbs: training continues from the onloaded state
        actor.onload().wait()
        logprobs = actor.compute_logprobs(batch).wait()
        metrics = actor.train_step(batch).wait(timeout=120)
        actor.export_hf(str(tmp_path / "megatron")).wait()
        # the weight sync: Megatron's TP shards into a one-rank native engine
        connect_groups(actor, rollout, "am_weights")
        [src] = actor.on_ranks(0).weight_layouts().wait()
        [dst] = rollout.on_ranks(0).weight_layouts().wait()
        plan = SyncPlan.build(src, dst, actor.name, rollout.name, bucket_bytes=16 << 10)
        wait_all([actor.connect_weights("am_weights", plan), rollout.connect_weights("am_weights", plan)])
        wait_all([actor.publish_weights(1), rollout.apply_weights(1)], timeout=60)
        synced = rollout.weights().wait()[0]
    finally:
        actor.shutdown()
        rollout.shutdown()
        reference.shutdown()

    ref_logprobs, ref, ref_weights = one_rank_step(path, batch, loop, loss, terms, optim.clip_grad)
    assert logprobs[1].shape[0] == 0  # the replica's second rank returns no rows: each row once
    assert ref_before[1].shape[0] == 0
    assert torch.equal(torch.cat(ref_before), torch.cat(logprobs))  # same numerics: the first step's KL is 0
    torch.testing.assert_close(torch.cat(logprobs), ref_logprobs, rtol=1e-5, atol=1e-5)
    mg = metrics[0]
    assert metrics[1] == pytest.approx(mg, rel=1e-6)  # both TP ranks report the replica's step
    assert mg["lr"] == LR and mg["skipped"] == 0.0
    for key in ref:  # fp32 on both: only the reduction order differs (TP splits the matmuls' sums)
        assert mg[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-6), key

    initial, exported = load(tmp_path / "qwen2"), load(tmp_path / "megatron")
    assert exported.keys() == initial.keys()
    for key, value in exported.items():
        # Adam's first step moves each weight by ~LR * g / (|g| + eps); TP's fp32 summation order changes
        # g by ~1e-7 relative, so the steps differ by far less than 1% of LR (measured: <= 5e-7 here)
        torch.testing.assert_close(value, ref_weights[key], rtol=0, atol=LR * 1e-2, msg=key)
        assert (ref_weights[key] - initial[key]).abs().max() > 0.5 * LR, key  # every tensor trained
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
             ({"actor__backend": "megatron", "actor__pp_size": 0}, r"actor.pp_size must be >= 1, got 0"),
             ({"actor__backend": "megatron", "runner__schedule": "dynamic"},
              r"runner.schedule=dynamic needs actor.backend=fsdp"),
             ({"actor__backend": "megatron", "actor__pp_size": 2, "actor__loop": LoopConfig(pack_sequences=True)},
              r"actor.loop.pack_sequences=true needs actor.pp_size=1 with actor.backend=megatron")]
    for sections, message in cases:
        with pytest.raises(ValueError, match=message):
            check_config(config(**sections))
    # placement-dependent: TP x PP must divide the actor's ranks, the rest are data-parallel replicas
    cfg = config(actor__backend="megatron", actor__tp_size=2, actor__pp_size=2)
    assert actor_replicas(cfg, 8) == 2
    with pytest.raises(ValueError, match=r"actor.tp_size x actor.pp_size = 2 x 2 must divide the actor's 6 ranks"):
        actor_replicas(cfg, 6)
    with pytest.raises(ValueError, match=r"must divide the reference's 2 ranks"):  # the KL reference is split alike
        actor_replicas(cfg, 2, "reference")
    # the runner's actor config carries the sizes and the same optimizer for either backend
    built = actor_config(cfg, "model")
    assert (built.backend, built.megatron.tensor_parallel, built.megatron.pipeline_parallel) == ("megatron", 2, 2)
    assert built.megatron.optim == built.fsdp.optim and built.fsdp.optim.lr == cfg.algorithm.lr
    with pytest.raises(ValueError, match=r"actor.backend='jax' is not one of"):
        check_actor_config(ActorConfig(backend="jax"))
