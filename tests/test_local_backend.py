"""The in-process backend (`cluster.backend=local`): the same WorkerGroup calls, errors, channels and numbers as
on Ray, with every worker on threads of this process."""

import dataclasses
import hashlib
import math
import threading
import time
from pathlib import Path

import pytest
import torch

from rlinf_like.runtime import (Channel, Cluster, ClusterConfig, GroupTimeoutError, PlacementError, Worker,
                                  WorkerError, connect_groups, control, wait_all)
from small_runs import small_reasoning_config


@dataclasses.dataclass
class Item:
    x: torch.Tensor


class Probe(Worker):
    def __init__(self, k: float):
        self.k, self.stop, self.seen = k, False, []

    def add(self, t: torch.Tensor) -> torch.Tensor:
        t += self.k  # in place: the driver's tensor must not change (Ray copies arguments)
        return t

    def where(self) -> tuple[str, int, int]:
        import os

        return threading.current_thread().name, os.getpid(), self.rank

    def boom(self) -> None:
        raise ValueError("the probe refuses")

    def produce(self, name: str, n: int, size: int) -> None:
        channel = Channel.connect(name)
        for i in range(n):
            channel.put(Item(torch.full((size,), float(i))))
        channel.close()

    def put_wrong(self, name: str) -> None:
        Channel.connect(name).put(3)

    def spin(self) -> str:
        while not self.stop:
            time.sleep(0.01)
        return "stopped"

    @control
    def halt(self) -> None:
        self.stop = True

    def send(self) -> bool:
        self.peer_group("w").send(torch.arange(4.0), 1)
        return True

    def recv(self) -> torch.Tensor:
        return self.peer_group("w").recv(torch.zeros(4), 0)

    def all_reduce(self) -> tuple[int, float]:
        import torch.distributed as dist

        t = torch.full((1,), self.k)
        dist.all_reduce(t)
        return dist.get_world_size(), t.item()


@pytest.fixture
def local():
    with Cluster(ClusterConfig(backend="local", num_cpus=2)) as cluster:
        placement = cluster.place({"a": "0", "b": "1"})
        yield cluster, Probe.create_group(1.0).launch(cluster, placement, "a"), \
            Probe.create_group(2.0).launch(cluster, placement, "b")


def test_calls_run_in_this_process_on_the_ranks_own_thread_with_copied_arguments(local):
    import os

    _, a, b = local
    x = torch.zeros(3)
    assert torch.equal(a.add(x).wait()[0], torch.ones(3))
    assert torch.equal(x, torch.zeros(3)), "the worker changed the driver's tensor: arguments must be copies"
    (thread_a, pid_a, rank), (thread_b, pid_b, _) = a.where().wait() + b.where().wait()
    assert pid_a == pid_b == os.getpid() and rank == 0
    assert thread_a != thread_b != threading.current_thread().name
    # each group's one rank has the shared one-rank default group (FSDP's mesh) for its collectives
    assert a.all_reduce().wait() == [(1, 1.0)] and b.all_reduce().wait() == [(1, 2.0)]


def test_a_worker_exception_arrives_as_worker_error_naming_group_and_rank(local):
    _, a, b = local
    with pytest.raises(WorkerError) as info:
        wait_all([b.where(), a.boom()])
    err = info.value
    assert (err.group, err.rank, err.method) == ("a", 0, "boom")
    assert isinstance(err.cause, ValueError) and "the probe refuses" in str(err) and "in boom" in str(err)
    assert a.where().wait()[0][2] == 0, "the rank keeps serving after a method raised"


def test_a_channel_carries_copies_in_order_and_refuses_the_wrong_type(local):
    _, a, _ = local
    channel = Channel.create("items", Item)
    done = a.produce("items", 3, 100_000)  # 400 KB each: over the inline size, through /dev/shm
    assert [item.x[0].item() for item in channel] == [0.0, 1.0, 2.0]
    done.wait()
    with pytest.raises(TypeError, match="carries Item, got builtins.int"):
        channel.put(3)
    with pytest.raises(WorkerError, match="carries Item"):
        a.put_wrong("items").wait()


def test_control_calls_get_through_a_running_call_and_timeouts_name_the_ranks(local):
    _, _, b = local
    spinning = b.spin()
    time.sleep(0.1)
    assert not spinning.done()
    with pytest.raises(GroupTimeoutError, match=r"ranks \[0\] did not finish spin\(\)"):
        spinning.wait(timeout=0.1)
    b.halt().wait()
    assert spinning.wait() == ["stopped"]


def test_a_peer_group_spans_two_groups_in_this_process(local):
    _, a, b = local
    connect_groups(a, b, "w")
    sent, [received] = wait_all([a.send(), b.recv()])
    assert sent == [True] and torch.equal(received, torch.arange(4.0))


def test_a_group_of_several_ranks_is_refused_naming_the_key_before_it_starts():
    with Cluster(ClusterConfig(backend="local", num_cpus=2, component_placement={"a": "0-1"})) as cluster:
        placement = cluster.place()
        with pytest.raises(PlacementError, match=r"cluster.component_placement.a=0-1 \(2 ranks\).*cluster.backend=ray"):
            Probe.create_group(1.0).launch(cluster, placement, "a")
    with pytest.raises(ValueError, match="cluster.address"):
        Cluster(ClusterConfig(backend="local", address="10.0.0.1:6379"))


DEBUGGED = """
from rlinf_like.runtime import Cluster, ClusterConfig, Worker


class Doubler(Worker):
    def step(self, x):
        y = x * 2
        breakpoint()
        return y


with Cluster(ClusterConfig(backend="local", num_cpus=1)) as cluster:
    group = Doubler.create_group().launch(cluster, cluster.place({"w": "0"}), "w", init_process_group=False)
    print("result", group.step(21).wait())
"""


def test_a_breakpoint_in_a_worker_method_stops_in_pdb_in_the_driver(tmp_path):
    """What README's debugging section promises: pdb opens inside the worker's method, reads the driver's stdin,
    sees the worker's locals and `self`, and the call returns once the session continues."""
    import os
    import subprocess
    import sys

    (tmp_path / "debug_me.py").write_text(DEBUGGED)
    env = {**os.environ, "PYTHONBREAKPOINT": "pdb.set_trace", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "debug_me.py"], input="p y, self.rank, self.name\nc\n", cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "-> return y" in out.stdout and "(42, 0, 'w[rank 0]')" in out.stdout
    assert out.stdout.rstrip().endswith("result [42]")


def _final_weights(out: Path) -> str:
    from safetensors.torch import load_file

    tensors = load_file(str(out / "final_model" / "model.safetensors"))
    return hashlib.sha256(b"".join(tensors[k].numpy().tobytes() for k in sorted(tensors))).hexdigest()


def _grpo(out: Path, backend: str, cluster: Cluster | None = None) -> list[dict]:
    from rlinf_like.runners.reasoning import train

    cfg = small_reasoning_config(out, max_steps=2)
    cfg.cluster.backend = backend
    cfg.cluster.component_placement = {"actor,rollout": "0", "reward": "1"}
    cfg.reward.fn = "user_rewards:digits"  # rewards that differ within a group: the weights move
    return train(cfg, cluster=cluster).history


TIMINGS = ("_s", "per_s", "elapsed")


@pytest.fixture(scope="module")
def ray_sides(tmp_path_factory, cluster):
    """The Ray runs the equality tests compare with, on the test session's Ray (`cluster=`: each run launches its
    workers there, on kept worker processes, and ends them at its end)."""
    root = tmp_path_factory.mktemp("ray_sides")
    return {"grpo": _grpo(root / "grpo", "ray", cluster), "sac": _sac(root / "sac", "ray", cluster)}, root


@pytest.mark.slow
def test_collocated_grpo_on_local_equals_ray_bit_for_bit(tmp_path, ray_sides):
    """Two GRPO steps (SFT-free, a reward that moves the weights) with one seed: every metric and every exported
    weight bit the same on both backends."""
    local_run = _grpo(tmp_path / "local", "local")
    runs, root = ray_sides
    ray_run = runs["grpo"]

    def numbers(history):
        return [{k: v for k, v in h.items() if not any(t in k for t in TIMINGS)} for h in history]

    assert len(local_run) == 3
    assert numbers(local_run) == numbers(ray_run)
    assert any(h.get("grad_norm", 0) > 0 for h in local_run), "no step moved the weights"
    assert all(math.isfinite(h.get("loss", 0.0)) for h in local_run)
    assert _final_weights(tmp_path / "local") == _final_weights(root / "grpo")


def _sac(out: Path, backend: str, cluster: Cluster | None = None) -> list[dict]:
    from test_embodied_sac import history, sac_config

    from rlinf_like.runners.embodied.sac import EmbodiedSACRunner

    cfg = sac_config(out)
    cfg.cluster.backend = backend
    runner = EmbodiedSACRunner(cfg, cluster=cluster)
    runner.run()
    return history(runner.history)


@pytest.mark.slow
def test_embodied_sac_on_local_equals_ray(tmp_path, ray_sides):
    """SAC's rollout and learner sample side by side; each from its own generator, so the in-process run draws
    what the Ray run draws: every round's metrics the same."""
    local_rounds = _sac(tmp_path / "local", "local")
    ray_rounds = ray_sides[0]["sac"]
    assert len(local_rounds) == 4 and "q_loss" in local_rounds[-1]
    assert local_rounds == ray_rounds
