import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported anywhere

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

# The real pretrained model the `real_model` tests load (made by scripts/setup.sh)
REAL_MODEL = Path(__file__).resolve().parent.parent / "models" / "smollm2-135m-instruct"
REAL_MODEL_COMMAND = "python -m rlinf_like.models.get smollm2-135m-instruct models/"


def pytest_configure(config):
    # On a GPU host the CPU suite runs as on a CPU machine (Ray would otherwise see the GPU, and the tests'
    # unprefixed placements like "0-1" would ask for GPUs). `pytest -m gpu` keeps the GPU visible.
    marks = config.option.markexpr or ""
    if "gpu" not in marks.replace("not gpu", ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config, items):
    from rlinf_like.models.get import is_complete

    if not is_complete(REAL_MODEL):
        skip_real = pytest.mark.skip(reason=f"needs {REAL_MODEL}: run `{REAL_MODEL_COMMAND}` in the repository root")
        for item in items:
            if "real_model" in item.keywords:
                item.add_marker(skip_real)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU, and `pytest -m gpu` on a GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def real_model_path() -> str:
    """The SmolLM2-135M-Instruct HF folder (tests using it carry @pytest.mark.real_model)."""
    from rlinf_like.models.get import is_complete

    if not is_complete(REAL_MODEL):
        pytest.skip(f"needs {REAL_MODEL}: run `{REAL_MODEL_COMMAND}` in the repository root")
    return str(REAL_MODEL)


@pytest.fixture(scope="session")
def cluster():
    """One real local Ray instance (2 CPU slots) for the whole session: starting Ray costs ~5 s. No GPUs, even on a
    GPU host: the CPU tests' unprefixed placements ("0-1") would otherwise ask for GPUs there."""
    from rlinf_like.scheduler import Cluster, ClusterConfig

    c = Cluster(ClusterConfig(num_cpus=2, num_gpus=0, collective_timeout_s=60, reserve_timeout_s=20))
    yield c
    c.shutdown()
