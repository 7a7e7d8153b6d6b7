"""Weight-sync transfer dtype: weights travel in the rollout's dtype (converted once, at the sender),
an explicit transfer dtype must equal it, and a tensor whose dtype differs from the plan's is refused
by name on either side, never silently cast."""

import pytest
import torch

from rlinf_like.hybrid_engines.reshard import (
    ReshardError, SyncPlan, WeightSyncError, apply_in_process, plan_reshard, replicated, sharded,
)
from rlinf_like.hybrid_engines.reshard.sync import check_dtypes
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, make_engine

SHAPE = (6, 4)


def layouts(dst_dtype="torch.bfloat16"):
    src = [sharded("w", SHAPE, 2, dim=0, dtype="torch.float32")]  # fp32 master weights on 2 actor ranks
    dst = [sharded("w", SHAPE, 2, dim=1, dtype=dst_dtype)]
    return src, dst


def test_default_transfer_dtype_is_the_rollouts():
    src, dst = layouts()
    plan = SyncPlan.build(src, dst, "actor", "rollout", bucket_bytes=1 << 20)
    assert plan.dst_dtypes == {"w": "torch.bfloat16"} and plan.src_dtypes == {"w": "torch.float32"}
    assert plan.nbytes == 6 * 4 * 2  # bf16 bytes travel, not fp32
    same = SyncPlan.build(src, dst, "actor", "rollout", transfer_dtype="torch.bfloat16")
    assert same.buckets == SyncPlan.build(src, dst, "actor", "rollout").buckets


def test_a_transfer_dtype_other_than_the_rollouts_is_an_error():
    src, dst = layouts()
    with pytest.raises(ReshardError, match=r"tensor 'w': transfer dtype torch.float16 differs from the rollout "
                                           r"dtype torch.bfloat16"):
        SyncPlan.build(src, dst, "actor", "rollout", transfer_dtype="torch.float16")


def test_a_tensor_that_changed_dtype_is_refused_by_name():
    src, dst = layouts()
    plan = SyncPlan.build(src, dst, "actor", "rollout")
    check_dtypes(plan.src_dtypes, {"w": torch.zeros(3, 4)}, "actor rank 0")  # as planned: fine
    with pytest.raises(WeightSyncError, match=r"actor rank 0: tensor 'w' is torch.float16, the sync plan was built "
                                              r"for torch.float32"):
        check_dtypes(plan.src_dtypes, {"w": torch.zeros(3, 4, dtype=torch.float16)}, "actor rank 0")
    with pytest.raises(WeightSyncError, match=r"rollout rank 1: tensor 'w' is torch.float32, the sync plan was "
                                              r"built for torch.bfloat16"):
        check_dtypes(plan.dst_dtypes, {"w": torch.zeros(6, 2)}, "rollout rank 1")


def test_fp32_weights_into_a_bf16_native_engine(tmp_path):
    """A real bf16 rollout engine: its layouts say bf16, and a sync leaves exactly the rounded weights."""
    from transformers import AutoModelForCausalLM

    path = write_tiny_model(tmp_path / "m", TinyModelSpec())
    engine = make_engine(RolloutConfig(engine="native", model_path=str(path), dtype="bfloat16"))
    targets = engine.weight_layouts()
    assert {t.dtype for t in targets} == {"torch.bfloat16"}
    actor = {n: p.detach() * 1.5 for n, p in AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
             .state_dict().items()}  # new fp32 "trained" weights
    sources = [replicated(n, tuple(t.shape), 1, str(t.dtype)) for n, t in actor.items()]
    transfers = plan_reshard(sources, targets)
    assert all(t.itemsize == 2 for t in transfers)
    received = engine.weight_tensors()
    apply_in_process(transfers, {0: actor}, {0: received})
    for name, tensor in received.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, actor[name].to(torch.bfloat16)), name
