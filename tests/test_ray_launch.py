"""ray_launch.sh: a local head starts, reports, is joined by a Cluster (and one expecting two nodes names
the missing one), and stops only itself."""

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(*args, env):
    return subprocess.run([str(ROOT / "ray_launch.sh"), *args], env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.extended  # ~35 s of two `ray start`s; the extended two-node run drives the same launcher (start, join, stop)
def test_start_status_join_stop(tmp_path):
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "RLINF_RAY_STATE_DIR": str(tmp_path / "state"), "PYTHON": sys.executable,
           "RAY": os.path.join(bin_dir, "ray"), "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    env.pop("RAY_ADDRESS", None)
    port = free_port()
    started = launch("start", "head", "--port", str(port), "--num-cpus", "1", "--expect-nodes", "1", env=env)
    try:
        assert started.returncode == 0, started.stderr + started.stdout
        assert f"127.0.0.1:{port}" in started.stdout and "1 node(s) up" in started.stdout
        again = launch("start", "head", "--port", str(port), env=env)
        assert again.returncode != 0 and "already running" in again.stderr

        status = launch("status", env=env)
        assert status.returncode == 0, status.stderr
        assert f"cluster 127.0.0.1:{port}" in status.stdout and "1 node(s) up" in status.stdout

        # a Cluster joins it; then one that expects 2 nodes (cluster.num_nodes) names the missing one after
        # reserve_timeout_s (checked here, on a joined cluster, rather than on a Ray of its own)
        join = subprocess.run(
            [sys.executable, "-c",
             "import json; from rlinf_like.runtime import Cluster, ClusterConfig\n"
             f"with Cluster(ClusterConfig(address='127.0.0.1:{port}')) as c:\n"
             "    joined = [c.num_cpus, c.is_local, len(c.nodes)]\n"
             "try:\n"
             f"    Cluster(ClusterConfig(address='127.0.0.1:{port}', num_nodes=2, reserve_timeout_s=2))\n"
             "    missing = 'no error'\n"
             "except RuntimeError as e:\n"
             "    missing = str(e)\n"
             "print(json.dumps([joined, missing]))"],
            env=env, capture_output=True, text=True, timeout=120)
        assert join.returncode == 0, join.stderr[-2000:]
        joined, missing = json.loads(join.stdout.strip().splitlines()[-1])
        assert joined == [1, False, 1]
        assert re.search(r"cluster.num_nodes=2, but only 1 node\(s\) joined within 2s", missing), missing
    finally:
        stopped = launch("stop", env=env)
    assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
    assert launch("status", env=env).returncode == 1
    with socket.socket() as s:  # the head's port is free again
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_bad_usage_is_explained(tmp_path):
    env = {**os.environ, "RLINF_RAY_STATE_DIR": str(tmp_path / "state")}
    out = launch("start", "worker", env=env)
    assert out.returncode != 0 and "needs --address" in out.stderr
    out = launch("start", "head", "--bogus", "1", env=env)
    assert out.returncode != 0 and "unknown option '--bogus'" in out.stderr
