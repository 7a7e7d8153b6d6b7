"""Channel put->get between two workers versus raw Ray between the same two actors.

Throughput: 1 MiB and 64 MiB tensor items, the same number of items in flight on both paths
(raw: ray.put + an actor call that ray.gets the ref). Latency: small-message ping-pong A->B->A,
over two channels versus one raw actor call A->B. The raw side gets the same window of items in
flight as the channel's maxsize. Each repetition runs both paths, the first one alternating between
repetitions; each repetition is printed, and the medians are compared. Last line: one JSON object,
ratios are ours / raw (throughput: higher is better, target >= 0.8; latency: lower is better, target <= 2.0).

    python bench/channel.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass

os.environ.setdefault("OMP_NUM_THREADS", "1")

import ray
import torch

from rlinf_like.runtime import Channel, Cluster, ClusterConfig, Worker


@dataclass
class Item:
    index: int
    data: torch.Tensor


@dataclass
class Ping:
    index: int
    note: str = "ping"


class Peer(Worker):
    """Rank of group "a" sends; rank of group "b" receives / echoes."""

    # --- receiver side ---------------------------------------------------------------------
    def take_ref(self, refs: list) -> int:
        return ray.get(refs[0]).data.numel()

    def echo(self, msg: Ping) -> Ping:
        return msg

    def drain(self, ch: Channel, n: int) -> int:
        return sum(ch.get().data.numel() for _ in range(n))

    def serve_pings(self, inbox: Channel, outbox: Channel, n: int) -> None:
        for _ in range(n):
            outbox.put(inbox.get())

    # --- sender side -----------------------------------------------------------------------
    def send_raw(self, peer, n: int, numel: int, window: int) -> float:
        item = Item(0, torch.ones(numel))
        t0 = time.perf_counter()
        inflight = []
        for i in range(n):
            ref = ray.put(Item(i, item.data))
            inflight.append(peer.execute.remote("take_ref", ([ref],), {}))
            if len(inflight) >= window:
                ray.get(inflight.pop(0))
        ray.get(inflight)
        return time.perf_counter() - t0

    def send_channel(self, ch: Channel, peer, n: int, numel: int) -> float:
        item = Item(0, torch.ones(numel))
        t0 = time.perf_counter()
        done = peer.execute.remote("drain", (ch, n), {})
        for i in range(n):
            ch.put(Item(i, item.data))
        ray.get(done)
        return time.perf_counter() - t0

    def ping_raw(self, peer, n: int) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            ray.get(peer.execute.remote("echo", (Ping(i),), {}))
        return (time.perf_counter() - t0) / n

    def ping_channel(self, outbox: Channel, inbox: Channel, peer, n: int) -> float:
        served = peer.execute.remote("serve_pings", (outbox, inbox, n), {})
        outbox.put(Ping(-1))  # warm both stores and the server loop
        inbox.get()
        t0 = time.perf_counter()
        for i in range(n - 1):
            outbox.put(Ping(i))
            inbox.get()
        elapsed = (time.perf_counter() - t0) / (n - 1)
        ray.get(served)
        return elapsed


def machine(when: str) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"machine ({when}): {platform.node()}, {os.cpu_count()} cores, ray {ray.__version__}, load average {load}"


def alternate(rep: int, raw, channel) -> tuple[float, float]:
    """Run both sides, raw first on even repetitions and the channel first on odd ones."""
    if rep % 2:
        ch = channel()
        return raw(), ch
    r = raw()
    return r, channel()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (CI smoke run)")
    args = parser.parse_args()
    reps = 3 if args.quick else 5
    window = 4
    sizes = {"1MiB": (1 << 20, 64 if not args.quick else 16), "64MiB": (64 << 20, 8 if not args.quick else 3)}
    n_pings = 100 if args.quick else 300
    print(machine("start"))
    print(f"settings: {reps} repetitions, window/maxsize {window}, items "
          + ", ".join(f"{n} x {label}" for label, (_, n) in sizes.items())
          + f", {n_pings} pings; 2 worker processes (one per CPU slot) and one store actor per channel, reached "
          "over its socket; channel tensors >= 64 KiB through /dev/shm files (one node), raw ones through Ray's object store")

    with Cluster(ClusterConfig(num_cpus=2, object_store_memory_mb=1024)) as cluster:
        placement = cluster.place({"a": "0", "b": "1"})
        a = Peer.create_group().launch(cluster, placement, "a", init_process_group=False)
        b = Peer.create_group().launch(cluster, placement, "b", init_process_group=False)
        peer = b.actor_handles()[0]
        results: dict = {}
        for label, (nbytes, n) in sizes.items():
            numel = nbytes // 4
            raw_t, ch_t = [], []
            # one channel for all repetitions, as the raw side reuses its actors: each repetition drains it, so it
            # starts empty (a store actor per repetition cost ~2-4 s of start-up each, most of a --quick run)
            ch = Channel.create(f"bench-{label}", item_type=Item, maxsize=window)
            ch.qsize()  # store is up before timing
            for rep in range(reps):
                r, c = alternate(rep, lambda: a.send_raw(peer, n, numel, window).wait()[0],
                                 lambda: a.send_channel(ch, peer, n, numel).wait()[0])
                raw_t.append(r), ch_t.append(c)
                mib = n * nbytes / 2**20
                print(f"  {label} rep {rep + 1}/{reps} ({'channel' if rep % 2 else 'raw'} first): "
                      f"raw {mib / r:8.1f} MiB/s   channel {mib / c:8.1f} MiB/s", flush=True)
            ch.destroy()
            raw_mib_s = n * nbytes / 2**20 / statistics.median(raw_t)
            ch_mib_s = n * nbytes / 2**20 / statistics.median(ch_t)
            results[label] = {"raw_mib_s": round(raw_mib_s, 1), "channel_mib_s": round(ch_mib_s, 1),
                              "ratio": round(ch_mib_s / raw_mib_s, 3)}
            print(f"throughput {label:>6}: channel {ch_mib_s:8.1f} MiB/s   raw ray {raw_mib_s:8.1f} MiB/s   "
                  f"ratio {ch_mib_s / raw_mib_s:.3f}")

        raw_l, ch_l = [], []
        ab = Channel.create("ping-ab", item_type=Ping)
        ba = Channel.create("ping-ba", item_type=Ping)
        ab.qsize(), ba.qsize()
        for rep in range(reps):
            r, c = alternate(rep, lambda: a.ping_raw(peer, n_pings).wait()[0],
                             lambda: a.ping_channel(ab, ba, peer, n_pings).wait()[0])
            raw_l.append(r), ch_l.append(c)
            print(f"  round trip rep {rep + 1}/{reps} ({'channel' if rep % 2 else 'raw'} first): "
                  f"raw {r * 1e3:.3f} ms   channel {c * 1e3:.3f} ms", flush=True)
        raw_ms, ch_ms = statistics.median(raw_l) * 1e3, statistics.median(ch_l) * 1e3
        ab.destroy(), ba.destroy()
        print(f"round trip (small message): channel {ch_ms:.3f} ms   raw ray actor call {raw_ms:.3f} ms   "
              f"ratio {ch_ms / raw_ms:.2f}")
        a.shutdown()
        b.shutdown()

    print(machine("end"))
    summary = {
        "bench": "channel",
        "throughput_ratio": min(r["ratio"] for r in results.values()),
        "latency_ratio": round(ch_ms / raw_ms, 3),
        "throughput": results,
        "round_trip_ms": {"channel": round(ch_ms, 3), "raw": round(raw_ms, 3)},
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
