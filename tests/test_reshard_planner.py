"""Reshard planning over shard metadata, checked by executing plans in process against the truth."""

from collections import Counter

import pytest
import torch

from rlinf_like.hybrid_engines.reshard import (
    NameMap,
    ReshardError,
    TensorLayout,
    apply_in_process,
    bucketize,
    plan_reshard,
    replicated,
    sharded,
    split_bounds,
)

SHAPES = {"embed": (10, 6), "q": (64, 12), "o": (12, 64), "norm": (5,), "tiny": (1, 3)}


def test_split_bounds():
    assert split_bounds(5, 2, "chunk") == [(0, 3), (3, 5)]
    assert split_bounds(1, 2, "chunk") == [(0, 1), (1, 1)]  # FSDP: the last rank can hold nothing
    assert split_bounds(64, 3, "balanced") == [(0, 22), (22, 43), (43, 64)]
    assert split_bounds(4, 4, "chunk") == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="'ring'"):
        split_bounds(4, 2, "ring")


def truth():
    g = torch.Generator().manual_seed(0)
    return {n: torch.randn(s, generator=g) for n, s in SHAPES.items()}


def materialize(layouts, full):
    """Each rank's local shards of `full`, cut by its layout boxes."""
    world = layouts[0].world_size
    return {r: {l.name: full[l.name][tuple(slice(a, b) for a, b in l.boxes[r])].clone() for l in layouts}
            for r in range(world)}


def empty_like_layout(layouts):
    world = layouts[0].world_size
    return {r: {l.name: torch.full(l.local_shape(r), float("nan")) for l in layouts} for r in range(world)}


def reshard_and_check(src_layouts, dst_layouts):
    full = truth()
    src, dst = materialize(src_layouts, full), empty_like_layout(dst_layouts)
    plan = plan_reshard(src_layouts, dst_layouts)
    copied = apply_in_process(plan, src, dst)
    expected = materialize(dst_layouts, full)
    for rank in dst:
        for name, tensor in dst[rank].items():
            assert torch.equal(tensor, expected[rank][name]), (rank, name)  # no NaN left, exact values
    # every target element is written exactly once: no duplicated traffic
    assert copied == sum(t.numel() * 4 for ranks in expected.values() for t in ranks.values())
    return plan


def fsdp(world):
    return [sharded(n, s, world, dim=0, mode="chunk") for n, s in SHAPES.items()]


def tp(world):
    # column-parallel q (dim 0), row-parallel o (dim 1), replicated norm/embed/tiny
    out = []
    for n, s in SHAPES.items():
        if n == "q":
            out.append(sharded(n, s, world, dim=0))
        elif n == "o":
            out.append(sharded(n, s, world, dim=1))
        else:
            out.append(replicated(n, s, world))
    return out


@pytest.mark.parametrize("src,dst", [
    (fsdp(2), tp(1)), (fsdp(2), tp(2)), (tp(2), tp(1)), (tp(2), tp(3)), (tp(3), fsdp(4)), (fsdp(3), tp(2)),
], ids=["fsdp2->tp1", "fsdp2->tp2", "tp2->tp1", "tp2->tp3", "tp3->fsdp4", "fsdp3->tp2"])
def test_reshard_is_exact(src, dst):
    reshard_and_check(src, dst)


def test_replicated_sources_prefer_the_targets_own_rank_and_spread_otherwise():
    plan = reshard_and_check(tp(2), tp(2))
    assert all(t.src_rank == t.dst_rank for t in plan)  # same layout: nothing crosses ranks
    spread = plan_reshard([replicated("norm", (5,), 2)], [replicated("norm", (5,), 4)])
    assert [t.src_rank for t in spread] == [0, 1, 0, 1]


def test_name_map_is_declarative():
    names = NameMap(((r"model\.layers\.(\d+)\.attn\.q\.weight", r"layers.\1.q_proj.weight"),))
    assert names("model.layers.3.attn.q.weight") == "layers.3.q_proj.weight"
    assert names("lm_head.weight") == "lm_head.weight"
    src = [sharded("model.layers.0.attn.q.weight", (8, 4), 2, dim=0, mode="chunk")]
    dst = [replicated("layers.0.q_proj.weight", (8, 4), 1)]
    plan = plan_reshard(src, dst, names)
    assert {(t.src_name, t.dst_name) for t in plan} == {("model.layers.0.attn.q.weight", "layers.0.q_proj.weight")}


@pytest.mark.parametrize("src,dst,fragment", [
    ([], [replicated("w", (4,), 1)], r"\['w'\] have no source"),
    ([replicated("w", (4,), 1)], [replicated("w", (5,), 1)], "'w'.*shape"),
    ([TensorLayout("w", (4,), (((0, 3),), ((2, 4),)))], [replicated("w", (4,), 1)], "'w'.*partly overlap"),
    ([TensorLayout("w", (4,), (((0, 2),), ((0, 2),)))], [replicated("w", (4,), 1)], "'w'.*whole tensor"),
])
def test_bad_layouts_name_the_tensor(src, dst, fragment):
    with pytest.raises(ReshardError, match=fragment):
        plan_reshard(src, dst)


def test_box_must_fit_shape():
    with pytest.raises(ValueError, match="'w'.*rank 1"):
        TensorLayout("w", (4,), (((0, 2),), ((2, 5),)))


def test_buckets_respect_the_byte_budget():
    plan = plan_reshard(fsdp(2), tp(1))
    buckets = bucketize(plan, bucket_bytes=256)
    assert set(buckets) == {(0, 0), (1, 0)}
    for per_pair in buckets.values():
        for bucket in per_pair:
            assert len(bucket) == 1 or sum(t.nbytes for t in bucket) <= 256
    flat = [t for per_pair in buckets.values() for bucket in per_pair for t in bucket]
    assert Counter(flat) == Counter(plan)  # every transfer exactly once
    assert any(len(per_pair) > 1 for per_pair in buckets.values())  # the budget did split something
