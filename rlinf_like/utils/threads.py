"""Keep every process to one intra-op thread: two cores shared by many processes swing 100x otherwise."""

import os


def limit_threads() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
    try:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    except ImportError:  # torch is a core dependency, but the scheduler itself does not need it
        pass
