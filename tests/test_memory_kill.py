"""A worker killed for memory surfaces as a WorkerDiedError that names the component, says it was killed for memory,
gives the rank's last measured memory and the config keys that reduce it — in a few lines, without Ray's dump."""

import os
import time

import pytest
import ray

from rlinf_like.runtime import Worker, WorkerDiedError, WorkerGroup
from rlinf_like.runtime.process_memory import GIB, MemorySample
from rlinf_like.runtime.worker_group import _convert

ADVICE = "rollout.kv_cache_memory_gb, rollout.max_batch_size"
# what Ray 2.x says when its memory monitor kills an actor's process (abridged only in the consumers' table)
MONITOR_KILL = (
    "The actor died unexpectedly before finishing this task.\n\tclass_name: _WorkerHost\n\tactor_id: 5c3e\n"
    "\tpid: 4242\n\tip: 10.0.0.7\nThe actor is dead because its worker process has died. "
    "Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the node running low on memory.\n"
    "Memory on the node (IP: 10.0.0.7, ID: 9f1d) was 22.91GB used / 23.20GB limit (0.987). "
    "The top 10 memory consumers are:\n\nPID\tMEM(GB)\tCOMMAND\n"
    + "".join(f"{4242 + i}\t{2.0 - i / 10:.2f}\tray::_WorkerHost.execute\n" for i in range(10))
    + "Refer to the documentation on how to address the out of memory issue: https://docs.ray.io/en/latest/ray-"
    "observability/user-guides/debug-apps/debug-memory.html. Consider provisioning more memory on this node or "
    "reducing task parallelism by requesting more CPUs per task. To adjust the kill threshold, set the environment "
    "variable `RAY_memory_usage_threshold` when starting Ray.")


def measured_group() -> WorkerGroup:
    group = WorkerGroup(Worker, (), {})
    group.memory_advice = ADVICE
    group.memory[0] = MemorySample(rss=3 * GIB, peak=int(3.5 * GIB), at=time.monotonic() - 2)
    return group


@pytest.mark.parametrize("err", [ray.exceptions.RayActorError(error_msg=MONITOR_KILL),
                                 ray.exceptions.OutOfMemoryError(MONITOR_KILL)], ids=["actor_died", "out_of_memory"])
def test_a_memory_monitor_kill_reads_as_the_component_its_memory_and_the_keys(err):
    died = _convert(err, "rollout", 0, "generate", measured_group())
    assert isinstance(died, WorkerDiedError) and died.memory_kill and (died.group, died.rank) == ("rollout", 0)
    message = str(died)
    assert message.startswith("worker rollout[rank 0] died during generate(): killed for memory by Ray's memory "
                              "monitor (the node had 22.91 GB used of a 23.20 GB limit)"), message
    assert "3.00 GiB resident (peak 3.50 GiB), 2 s before it died" in message
    assert message.endswith(f"To give rollout less to hold: {ADVICE}")
    assert "\n" not in message and "top 10" not in message and "docs.ray.io" not in message


def test_other_deaths_keep_their_detail_and_are_not_called_memory_kills():
    died = _convert(ray.exceptions.RayActorError(error_msg="The actor was killed by ray.kill."), "actor", 1, "step",
                    measured_group())
    assert isinstance(died, WorkerDiedError) and not died.memory_kill
    assert str(died) == "worker actor[rank 1] died during step(): The actor was killed by ray.kill."


class Hog(Worker):
    def grow_then_die(self, mb: int) -> None:
        held = b"\x01" * (mb << 20)  # touched: resident, as a run's tensors are
        time.sleep(2.5)  # the driver reads the rank's memory once a second while it waits
        assert held
        os.kill(os.getpid(), 9)  # what the kernel's OOM killer does


@pytest.mark.timeout(60)
def test_a_sigkilled_worker_names_its_group_last_memory_and_the_keys(cluster):
    group = Hog.create_group().launch(cluster, cluster.place({"hog": "0"}), "hog", init_process_group=False,
                                      memory_advice=ADVICE)
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.grow_then_die(256).wait(timeout=30)
    finally:
        group.shutdown()
    message = str(info.value)
    assert info.value.memory_kill and (info.value.group, info.value.rank) == ("hog", 0)
    assert message.startswith("worker hog[rank 0] died during grow_then_die(): killed with no Python error: a "
                              "SIGKILL, most often the kernel's OOM killer"), message
    assert message.endswith(f"To give hog less to hold: {ADVICE}") and "\n" not in message
    peak = group.memory[0].peak
    assert peak > 256 << 20 and f"(peak {peak / GIB:.2f} GiB)" in message


def test_worker_errors_survive_pickling_with_their_fields():
    """A spawned process pool (the tests' side-by-side runs) sends a worker's error back pickled; before, unpickling
    called __init__ with the message alone and broke the pool instead of showing the error."""
    import pickle

    from rlinf_like.runtime.errors import GroupTimeoutError, WorkerDiedError, WorkerError

    for err in (WorkerError("actor", 1, "train_step", "Traceback ...\nValueError: x", ValueError("x")),
                WorkerDiedError("rollout", 0, "generate", "killed for memory", memory_kill=True),
                GroupTimeoutError("actor", "train_step", [0, 1], 5.0)):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.group == err.group
    assert pickle.loads(pickle.dumps(WorkerDiedError("r", 0, "g", "d", memory_kill=True))).memory_kill
