import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported anywhere

import pytest
import torch

torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster():
    """One real local Ray instance (2 CPU slots) for the whole session: starting Ray costs ~5 s."""
    from rlinf_like.scheduler import Cluster, ClusterConfig

    c = Cluster(ClusterConfig(num_cpus=2, collective_timeout_s=60, reserve_timeout_s=20))
    yield c
    c.shutdown()
