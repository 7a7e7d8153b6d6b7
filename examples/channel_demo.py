"""Workers exchanging data over typed channels: the project's main job until GRPO lands.

    python examples/channel_demo.py                       # embedded defaults: local Ray, CPU
    python examples/channel_demo.py demo.num_items=200 cluster.component_placement.consumer=0

Producers put `Batch` items (tensors) into a channel, consumers check each one bit-exactly and
answer with a `Receipt` on a second channel; the two groups also share a peer process group
over which producer rank 0 broadcasts a "weights" tensor. Metrics go to TensorBoard.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

os.environ.setdefault("OMP_NUM_THREADS", "1")

import hydra
from hydra.core.config_store import ConfigStore
import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from rlinf_like.config import check_overrides, hydra_schema, structure
from rlinf_like.runtime import Channel, Cluster, ClusterConfig, Worker, connect_groups, wait_all
from rlinf_like.utils.logging import setup_logging
from rlinf_like.utils.threads import limit_threads

COMPONENTS = ("producer", "consumer")


@dataclass(kw_only=True)
class DemoConfig:
    num_items: int = 48
    item_mib: float = 1.0
    maxsize: int = 4
    log_dir: str = "runs/channel_demo"


@dataclass(kw_only=True)
class RunConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    demo: DemoConfig = field(default_factory=DemoConfig)


@dataclass
class Batch:
    index: int
    seed: int
    data: torch.Tensor
    sent_at: float


@dataclass
class Receipt:
    index: int
    consumer_rank: int
    exact: bool
    latency_s: float


def make_data(seed: int, numel: int) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(seed))


class Producer(Worker):
    def produce(self, batches: Channel, indices: list[int], numel: int) -> int:
        for i in indices:
            batches.put(Batch(i, seed=1000 + i, data=make_data(1000 + i, numel), sent_at=time.time()))
        return len(indices)

    def share_weights(self) -> float:
        weights = make_data(7, 1024)
        self.peer_group("weights").broadcast(weights, src=0)
        return weights.sum().item()


class Consumer(Worker):
    def consume(self, batches: Channel, receipts: Channel) -> int:
        n = 0
        for batch in batches:  # until the channel is closed and drained
            exact = torch.equal(batch.data, make_data(batch.seed, batch.data.numel()))
            receipts.put(Receipt(batch.index, self.rank, exact, time.time() - batch.sent_at))
            n += 1
        return n

    def receive_weights(self) -> float:
        weights = torch.zeros(1024)
        self.peer_group("weights").broadcast(weights, src=0)
        return weights.sum().item()


def run(cfg: RunConfig) -> dict:
    limit_threads()
    with Cluster(cfg.cluster) as cluster:
        print(cluster.describe())
        placement = cluster.place(known_components=COMPONENTS)
        print(placement.describe())
        producers = Producer.create_group().launch(cluster, placement, "producer")
        consumers = Consumer.create_group().launch(cluster, placement, "consumer")
        connect_groups(producers, consumers, "weights")
        sums = wait_all([producers.share_weights(), consumers.receive_weights()])
        assert len({s for group in sums for s in group}) == 1, f"weights differ after broadcast: {sums}"

        batches = Channel.create("batches", item_type=Batch, maxsize=cfg.demo.maxsize)
        receipts = Channel.create("receipts", item_type=Receipt)
        numel = int(cfg.demo.item_mib * 2**20 / 4)
        batches.qsize(), receipts.qsize()  # both stores are up: time the exchange, not process starts
        writer = SummaryWriter(cfg.demo.log_dir)
        start, got = time.time(), []
        consuming = consumers.consume(batches, receipts)
        shards = [list(range(r, cfg.demo.num_items, producers.world_size)) for r in range(producers.world_size)]
        producing = [producers.on_ranks(r).produce(batches, shards[r], numel) for r in range(producers.world_size)]
        for _ in tqdm(range(cfg.demo.num_items), desc="batches verified", unit="batch"):
            receipt = receipts.get(timeout=cfg.cluster.collective_timeout_s)
            got.append(receipt)
            writer.add_scalar("demo/latency_ms", receipt.latency_s * 1e3, len(got))
        wait_all(producing)
        batches.close()
        consumed = consuming.wait(timeout=cfg.cluster.collective_timeout_s)
        elapsed = time.time() - start
        mib_s = cfg.demo.num_items * cfg.demo.item_mib / elapsed
        writer.add_scalar("demo/throughput_mib_s", mib_s, 0)
        writer.close()

    summary = {
        "mode": placement.mode.value,
        "items": len(got),
        "exact": sum(r.exact for r in got),
        "per_consumer": consumed,
        "throughput_mib_s": round(mib_s, 1),
        "median_latency_ms": round(sorted(r.latency_s for r in got)[len(got) // 2] * 1e3, 2),
    }
    print("\n  metric             value")
    for key, value in summary.items():
        print(f"  {key:<18} {value}")
    print(f"TensorBoard: tensorboard --logdir {cfg.demo.log_dir}")
    if summary["exact"] != summary["items"]:
        raise SystemExit(f"{summary['items'] - summary['exact']} batches arrived corrupted")
    return summary


# the schema under the YAML: hydra then types every value (a placement override `consumer=0` becomes "0")
ConfigStore.instance().store(name="demo_schema", node=hydra_schema(RunConfig))


@hydra.main(config_path="config", config_name="channel_demo", version_base="1.3")
def main(cfg) -> None:
    setup_logging()  # after Hydra has set up logging
    run(structure(RunConfig, cfg))


if __name__ == "__main__":
    check_overrides(RunConfig, sys.argv[1:])  # a typo fails here, naming the allowed keys
    main()
