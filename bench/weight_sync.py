"""Reshard + weight sync versus one raw broadcast of the same bytes over the same process group.

Actor: FSDP-style dp=2 (DTensor Shard(0)); rollout: Megatron-style tp=2 (column-parallel q/k/v/
gate/up, row-parallel o/down). About 100M fp32 parameters laid out like Llama layers. Both paths
run over the same gloo peer group of the 4 processes; repetitions alternate; medians compared.
The same plan also runs over transport "ipc" (shared-memory handles; CUDA IPC on GPU).
Last line: one JSON object, ratio = ours / raw (lower is better; target <= 1.2), ipc_ratio likewise.

`--megatron`: a real MegatronModelManager (TP=2, a ~110M-parameter Llama-style HF checkpoint) syncs
into a real native rollout engine (tp=1): HF-named shards (q/k/v and gate/up split out of megatron's
fused tensors, every publish) -> the engine's fused weights, versus one raw broadcast of the same
bytes over the same peer group of the 3 processes.

    python bench/weight_sync.py [--quick] [--megatron]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from rlinf_like.hybrid_engines.reshard import (
    TRANSPORTS, SyncPlan, WeightReceiver, WeightSender, dtensor_layout, replicated, sharded,
)
from rlinf_like.scheduler import Cluster, ClusterConfig, Worker, connect_groups, wait_all

COLUMN = ("q", "k", "v", "gate", "up")  # split output features (dim 0) under TP
ROW = ("o", "down")  # split input features (dim 1)


def model_shapes(hidden: int, ffn: int, layers: int) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for i in range(layers):
        for n in ("q", "k", "v", "o"):
            shapes[f"layers.{i}.{n}"] = (hidden, hidden)
        shapes[f"layers.{i}.gate"] = shapes[f"layers.{i}.up"] = (ffn, hidden)
        shapes[f"layers.{i}.down"] = (hidden, ffn)
        shapes[f"layers.{i}.norm"] = (hidden,)
    return shapes


def rollout_layouts(shapes, tp):
    out = []
    for name, shape in shapes.items():
        kind = name.rsplit(".", 1)[1]
        if kind in COLUMN:
            out.append(sharded(name, shape, tp, dim=0))
        elif kind in ROW:
            out.append(sharded(name, shape, tp, dim=1))
        else:
            out.append(replicated(name, shape, tp))
    return out


class Actor(Worker):
    def __init__(self, shapes):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard

        from rlinf_like.hybrid_engines.reshard import split_bounds

        mesh = init_device_mesh("cpu", (self.world_size,))
        self.tensors = {}
        for name, shape in shapes.items():
            lo, hi = split_bounds(shape[0], self.world_size, "chunk")[self.rank]
            local = torch.randn((hi - lo, *shape[1:]))
            self.tensors[name] = DTensor.from_local(local, mesh, [Shard(0)], shape=shape,
                                                    stride=torch.empty(shape, device="meta").stride())

    def layouts(self):
        return [dtensor_layout(n, t) for n, t in self.tensors.items()]

    def init(self, plan):
        self.senders = {t: WeightSender(self.peer_group("weights"), plan, self.rank, t) for t in TRANSPORTS}

    def publish(self, version, transport):
        return self.senders[transport].publish(version, self.tensors)

    def raw_broadcast(self, nbytes):
        buffer = torch.ones(nbytes, dtype=torch.uint8)
        self.peer_group("weights").broadcast(buffer, src=0)


class Rollout(Worker):
    def __init__(self, shapes):
        self.layouts_ = rollout_layouts(shapes, self.world_size)
        self.tensors = {l.name: torch.empty(l.local_shape(self.rank)) for l in self.layouts_}

    def init(self, plan):
        self.receivers = {t: WeightReceiver(self.peer_group("weights"), plan, self.rank, self.tensors, t)
                          for t in TRANSPORTS}

    def apply(self, version, transport):
        return self.receivers[transport].apply(version)

    def raw_broadcast(self, nbytes):
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        self.peer_group("weights").broadcast(buffer, src=0)


class MegatronActor(Worker):
    def __init__(self, path):
        from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager

        self.manager = MegatronModelManager(path, MegatronConfig(tensor_parallel=self.world_size))

    def layouts(self):
        return self.manager.shard_layouts()

    def init(self, plan):
        self.senders = {t: WeightSender(self.peer_group("weights"), plan, self.rank, t) for t in TRANSPORTS}

    def publish(self, version, transport):
        return self.senders[transport].publish(version, self.manager.named_shards())

    raw_broadcast = Actor.raw_broadcast


class NativeRollout(Worker):
    def __init__(self, path):
        from rlinf_like.workers.rollout.engine import RolloutConfig, make_engine

        self.engine = make_engine(RolloutConfig(model_path=path, max_batch_size=1))

    def layouts(self):
        return self.engine.weight_layouts()

    def init(self, plan):
        # one receiver per transport over the engine's own (fused, HF-named view) weight tensors
        self.receivers = {t: WeightReceiver(self.peer_group("weights"), plan, self.rank, self.engine.weight_tensors(), t)
                          for t in TRANSPORTS}

    def apply(self, version, transport):
        return self.receivers[transport].apply(version)

    raw_broadcast = Rollout.raw_broadcast


def time_rounds(actor, rollout, raw_bytes: int, reps: int) -> tuple[float, float, float]:
    """Median seconds of (sync over the group, one raw broadcast of `raw_bytes`, sync over ipc),
    alternating within each round so all three see the same machine state."""
    times: dict[str, list[float]] = {"raw": [], **{t: [] for t in TRANSPORTS}}
    for version in range(1, reps + 1):
        t0 = time.perf_counter()
        wait_all([actor.raw_broadcast(raw_bytes), rollout.raw_broadcast(raw_bytes)])
        times["raw"].append(time.perf_counter() - t0)
        for transport in TRANSPORTS:
            t0 = time.perf_counter()
            wait_all([actor.publish(version, transport), rollout.apply(version, transport)])
            times[transport].append(time.perf_counter() - t0)
    return tuple(statistics.median(times[k]) for k in ("group", "raw", "ipc"))


def megatron_case(quick: bool) -> None:
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, ffn, layers, reps = (512, 1408, 4, 2) if quick else (1024, 2816, 8, 3)
    path = tempfile.mkdtemp(prefix="bench_megatron_")
    config = LlamaConfig(vocab_size=8192, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
                         num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=256)
    LlamaForCausalLM(config).save_pretrained(path)
    with Cluster(ClusterConfig(num_cpus=2, collective_timeout_s=600)) as cluster:
        placement = cluster.place({"actor": "0-1", "rollout": "0"})
        actor = MegatronActor.create_group(path).launch(cluster, placement, "actor", timeout=600)
        rollout = NativeRollout.create_group(path).launch(cluster, placement, "rollout", timeout=600)
        connect_groups(actor, rollout, "weights")
        [src] = actor.on_ranks(0).layouts().wait()
        [dst] = rollout.layouts().wait()
        plan = SyncPlan.build(src, dst, "actor", "rollout", bucket_bytes=128 << 20)
        wait_all([actor.init(plan), rollout.init(plan)])
        ours_s, raw_s, ipc_s = time_rounds(actor, rollout, plan.nbytes, reps)
        actor.shutdown()
        rollout.shutdown()
    params = sum(torch.Size(l.shape).numel() for l in src)
    print(f"megatron tp=2 -> native rollout tp=1: {params / 1e6:.0f}M params, {len(plan.buckets)} buckets, "
          f"{plan.nbytes / 2**20:.0f} MiB; reshard + sync {ours_s:.2f} s, raw broadcast {raw_s:.2f} s, "
          f"ratio {ours_s / raw_s:.3f}; over shared memory (ipc) {ipc_s:.2f} s, ratio {ipc_s / raw_s:.3f}")
    print(json.dumps({"bench": "weight_sync_megatron", "ratio": round(ours_s / raw_s, 3),
                      "ipc_ratio": round(ipc_s / raw_s, 3), "bytes": plan.nbytes, "params": params}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--megatron", action="store_true", help="megatron tp=2 -> native rollout tp=1")
    args = parser.parse_args()
    if args.megatron:
        return megatron_case(args.quick)
    hidden, ffn, layers, reps = (512, 1408, 4, 2) if args.quick else (1024, 2816, 8, 3)
    shapes = model_shapes(hidden, ffn, layers)
    n_params = sum(torch.Size(s).numel() for s in shapes.values())
    with Cluster(ClusterConfig(num_cpus=2, collective_timeout_s=600)) as cluster:
        placement = cluster.place({"actor,rollout": "0-1"})
        actor = Actor.create_group(shapes).launch(cluster, placement, "actor")
        rollout = Rollout.create_group(shapes).launch(cluster, placement, "rollout")
        connect_groups(actor, rollout, "weights")
        [src] = actor.on_ranks(0).layouts().wait()
        plan = SyncPlan.build(src, rollout_layouts(shapes, 2), "actor", "rollout", bucket_bytes=128 << 20)
        wait_all([actor.init(plan), rollout.init(plan)])
        total = n_params * 4
        ours_s, raw_s, ipc_s = time_rounds(actor, rollout, total, reps)
        actor.shutdown()
        rollout.shutdown()
    print(f"{n_params / 1e6:.0f}M params ({total / 2**20:.0f} MiB), dp=2 -> tp=2, {len(plan.buckets)} buckets, "
          f"{plan.nbytes / 2**20:.0f} MiB moved by the plan")
    print(f"reshard + sync {ours_s:.2f} s ({plan.nbytes / ours_s / 1e9:.2f} GB/s)   "
          f"raw broadcast of {total / 2**20:.0f} MiB {raw_s:.2f} s   ratio {ours_s / raw_s:.3f}")
    print(f"same plan over shared memory (transport 'ipc') {ipc_s:.2f} s   ratio {ipc_s / raw_s:.3f}")
    print(json.dumps({"bench": "weight_sync", "ratio": round(ours_s / raw_s, 3), "ipc_ratio": round(ipc_s / raw_s, 3),
                      "bytes": total,
                      "plan_bytes": plan.nbytes, "params": n_params}))


if __name__ == "__main__":
    main()
