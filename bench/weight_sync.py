"""Reshard + weight sync versus two baselines over the same process group, buffers preallocated on all sides.

Actor: FSDP-style dp=2 (DTensor Shard(0)); rollout: Megatron-style tp=2 (column-parallel q/k/v/
gate/up, row-parallel o/down). About 100M fp32 parameters laid out like Llama layers. Every path
runs over the same gloo peer group of the 4 processes:
- fair: hand-written point-to-point sends of exactly the slices our plan moves (bench/weight_sync_baselines.py);
- broadcast: the naive sync, one broadcast of the whole model from actor rank 0 to every process;
- ours: the plan over transport "group" (the ratios), and over "ipc" (shared-memory handles; CUDA IPC on GPU).
Each repetition runs every path, in an order that rotates between repetitions; medians are compared.
copy_bandwidth_fraction: the plan's bytes / our sync time, over one plain memory copy's GB/s on this machine.
Last line: one JSON object; ratios are ours / baseline (lower is better; targets: <= 1.1 against the fair
baseline, copy_bandwidth_fraction >= 0.5).

`--megatron`: a real MegatronModelManager (TP=2, a ~110M-parameter Llama-style HF checkpoint) syncs
into a real native rollout engine (tp=1): HF-named shards (q/k/v and gate/up split out of megatron's
fused tensors, every publish, on every path) -> the engine's fused weights, over the peer group of the 3 processes.

    python bench/weight_sync.py [--quick] [--megatron]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench.weight_sync_baselines, run as a script

from bench.weight_sync_baselines import HandSync, RawBroadcast, copy_gbps, machine
from rlinf_like.hybrid_engines.reshard import (
    TRANSPORTS, SyncPlan, WeightReceiver, WeightSender, dtensor_layout, replicated, sharded,
)
from rlinf_like.hybrid_engines.reshard.layout import dtype_from_name
from rlinf_like.runtime import Cluster, ClusterConfig, Worker, connect_groups, wait_all

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


class SenderSide:
    """The actor side of every path; `shards()` gives this round's local tensors."""

    def init(self, plan, broadcast_bytes: int):
        group = self.peer_group("weights")
        self.senders = {t: WeightSender(group, plan, self.rank, t) for t in TRANSPORTS}
        self.hand = HandSync(group, plan, "send", self.rank, self.shards())
        self.bcast = RawBroadcast(group, broadcast_bytes, is_source=self.rank == 0)
        self.bcast_src = group.ranks[plan.src_group][0]

    def step(self, path: str, version: int) -> None:
        if path == "fair":
            self.hand.run(self.shards())
        elif path == "broadcast":
            self.bcast.run(self.bcast_src)
        else:
            self.senders[path].publish(version, self.shards())


class ReceiverSide:
    def init(self, plan, broadcast_bytes: int):
        group = self.peer_group("weights")
        self.receivers = {t: WeightReceiver(group, plan, self.rank, self.targets(), t) for t in TRANSPORTS}
        self.hand = HandSync(group, plan, "recv", self.rank, self.targets())
        self.bcast = RawBroadcast(group, broadcast_bytes, is_source=False)
        self.bcast_src = group.ranks[plan.src_group][0]

    def step(self, path: str, version: int) -> None:
        if path == "fair":
            self.hand.run()
        elif path == "broadcast":
            self.bcast.run(self.bcast_src)
        else:
            self.receivers[path].apply(version)


class Actor(SenderSide, Worker):
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

    def shards(self):
        return self.tensors


class Rollout(ReceiverSide, Worker):
    def __init__(self, shapes):
        self.layouts_ = rollout_layouts(shapes, self.world_size)
        self.tensors = {l.name: torch.zeros(l.local_shape(self.rank)) for l in self.layouts_}

    def targets(self):
        return self.tensors


class MegatronActor(SenderSide, Worker):
    def __init__(self, path):
        from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager

        self.manager = MegatronModelManager(path, MegatronConfig(tensor_parallel=self.world_size))

    def layouts(self):
        return self.manager.shard_layouts()

    def shards(self):
        return self.manager.named_shards()


class NativeRollout(ReceiverSide, Worker):
    def __init__(self, path):
        from rlinf_like.workers.rollout.engine import RolloutConfig, make_engine

        self.engine = make_engine(RolloutConfig(model_path=path, max_batch_size=1))

    def layouts(self):
        return self.engine.weight_layouts()

    def targets(self):
        return self.engine.weight_tensors()  # the engine's own (fused, HF-named view) weight tensors


PATHS = ("fair", "broadcast", "group", "ipc")


def time_rounds(actor, rollout, reps: int) -> dict[str, float]:
    """Median seconds of each path. Every repetition runs all paths, in an order rotated by one each time,
    so no path always runs first (or right after another)."""
    wait_all([actor.step("group", 0), rollout.step("group", 0)])  # warm: first-round setup, pages touched
    wait_all([actor.step("fair", 0), rollout.step("fair", 0)])
    wait_all([actor.step("ipc", 0), rollout.step("ipc", 0)])
    times: dict[str, list[float]] = {p: [] for p in PATHS}
    for rep in range(reps):
        order = PATHS[rep % len(PATHS):] + PATHS[:rep % len(PATHS)]
        for path in order:
            t0 = time.perf_counter()
            wait_all([actor.step(path, rep + 1), rollout.step(path, rep + 1)])
            times[path].append(time.perf_counter() - t0)
        print(f"rep {rep + 1}/{reps} (order {' '.join(order)}): "
              + "   ".join(f"{p} {times[p][-1]:.3f} s" for p in PATHS), flush=True)
    return {p: statistics.median(v) for p, v in times.items()}


def report(name: str, med: dict[str, float], plan_bytes: int, broadcast_bytes: int, extra: dict) -> None:
    copy = copy_gbps(plan_bytes)
    gbps = {p: plan_bytes / med[p] / 1e9 for p in ("fair", "group", "ipc")}
    print(f"medians: ours (group) {med['group']:.3f} s = {gbps['group']:.2f} GB/s;  fair p2p {med['fair']:.3f} s = "
          f"{gbps['fair']:.2f} GB/s;  broadcast of {broadcast_bytes / 2**20:.0f} MiB {med['broadcast']:.3f} s;  "
          f"ours (ipc) {med['ipc']:.3f} s = {gbps['ipc']:.2f} GB/s;  plain memory copy {copy:.2f} GB/s (one thread)")
    print(machine("end"))
    print(json.dumps({"bench": name, "ratio_fair": round(med["group"] / med["fair"], 3),
                      "ratio_broadcast": round(med["group"] / med["broadcast"], 3),
                      "copy_bandwidth_fraction": round(gbps["group"] / copy, 3), "bytes": plan_bytes,
                      "ipc_ratio_fair": round(med["ipc"] / med["fair"], 3),
                      "ipc_copy_bandwidth_fraction": round(gbps["ipc"] / copy, 3),
                      "copy_gbps": round(copy, 2), "ours_gbps": round(gbps["group"], 2), **extra}))


def model_bytes(layouts) -> int:
    return sum(torch.Size(l.shape).numel() * dtype_from_name(l.dtype).itemsize for l in layouts)


def megatron_case(quick: bool) -> None:
    import tempfile

    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, ffn, layers, reps = (512, 1408, 4, 3) if quick else (1024, 2816, 8, 5)
    print(machine("start"))
    print(f"settings: megatron tp=2 -> native rollout tp=1, hidden {hidden}, ffn {ffn}, {layers} layers, fp32, "
          f"gloo, bucket 128 MiB, {reps} repetitions, 3 processes on 2 CPU slots")
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
        total = model_bytes(src)
        wait_all([actor.init(plan, total), rollout.init(plan, total)])
        print(f"{sum(torch.Size(l.shape).numel() for l in src) / 1e6:.0f}M params, {len(plan.buckets)} buckets, "
              f"{plan.nbytes / 2**20:.0f} MiB moved by the plan, {total / 2**20:.0f} MiB broadcast", flush=True)
        med = time_rounds(actor, rollout, reps)
        actor.shutdown()
        rollout.shutdown()
    report("weight_sync_megatron", med, plan.nbytes, total, {"reps": reps})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--megatron", action="store_true", help="megatron tp=2 -> native rollout tp=1")
    args = parser.parse_args()
    if args.megatron:
        return megatron_case(args.quick)
    hidden, ffn, layers, reps = (512, 1408, 4, 3) if args.quick else (1024, 2816, 8, 5)
    print(machine("start"))
    print(f"settings: actor dp=2 (DTensor Shard(0)) -> rollout tp=2, hidden {hidden}, ffn {ffn}, {layers} layers, "
          f"fp32, gloo, bucket 128 MiB, {reps} repetitions, 4 processes on 2 CPU slots")
    shapes = model_shapes(hidden, ffn, layers)
    with Cluster(ClusterConfig(num_cpus=2, collective_timeout_s=600)) as cluster:
        placement = cluster.place({"actor,rollout": "0-1"})
        actor = Actor.create_group(shapes).launch(cluster, placement, "actor")
        rollout = Rollout.create_group(shapes).launch(cluster, placement, "rollout")
        connect_groups(actor, rollout, "weights")
        [src] = actor.on_ranks(0).layouts().wait()
        plan = SyncPlan.build(src, rollout_layouts(shapes, 2), "actor", "rollout", bucket_bytes=128 << 20)
        total = model_bytes(src)
        wait_all([actor.init(plan, total), rollout.init(plan, total)])
        print(f"{total / 4e6:.0f}M params ({total / 2**20:.0f} MiB), {len(plan.buckets)} buckets, "
              f"{plan.nbytes / 2**20:.0f} MiB moved by the plan", flush=True)
        med = time_rounds(actor, rollout, reps)
        actor.shutdown()
        rollout.shutdown()
    report("weight_sync", med, plan.nbytes, total, {"reps": reps})


if __name__ == "__main__":
    main()
