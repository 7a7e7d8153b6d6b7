"""Cluster: local start, topology report, joining an existing instance, no hidden singleton."""

import json
import os
import subprocess
import sys

import pytest
import ray

from rlinf_like.runtime import Cluster

JOIN_SCRIPT = """
import json
from rlinf_like.runtime import Cluster, ClusterConfig
address = {address!r}
with Cluster(ClusterConfig(address=address) if address else ClusterConfig()) as c:
    print(json.dumps({{"nodes": [n.node_id for n in c.nodes], "cpus": c.num_cpus, "gpus": c.num_gpus,
                      "local": c.is_local, "cpu_devices": len(c.devices["cpu"])}}))
"""


def test_local_cluster_reports_nodes_and_devices(cluster):
    assert len(cluster.nodes) == 1
    node = cluster.nodes[0]
    assert node.is_head and node.num_cpus == 2 and node.num_gpus == 0
    assert cluster.num_cpus == 2 and cluster.num_gpus == 0
    assert [d.index for d in cluster.devices["cpu"]] == [0, 1] and cluster.devices["gpu"] == []
    assert cluster.is_local
    assert "2 CPU, 0 GPU" in cluster.describe()


def test_second_cluster_in_the_same_process_is_refused(cluster):
    with pytest.raises(RuntimeError, match="already initialized"):
        Cluster()


@pytest.mark.parametrize("via", ["config", "env"])
def test_another_process_joins_the_running_cluster(cluster, via):
    gcs = ray.get_runtime_context().gcs_address
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    if via == "env":
        env["RAY_ADDRESS"] = gcs
    script = JOIN_SCRIPT.format(address=gcs if via == "config" else None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report == {"nodes": [cluster.nodes[0].node_id], "cpus": 2, "gpus": 0, "local": False, "cpu_devices": 2}
    assert ray.is_initialized()  # the joiner's shutdown disconnects it, not our instance
