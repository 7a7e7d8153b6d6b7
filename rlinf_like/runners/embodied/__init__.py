"""Embodied RL: the PPO runner (`runner.py`), the SAC rounds (`sac.py`), their schema (`config.py`) and the
final policy's GIF (`media.py`)."""

from __future__ import annotations

from rlinf_like.runtime import Cluster


def train(cfg, cluster: Cluster | None = None) -> dict:
    """Run `cfg` (an `EmbodiedConfig`) with the runner its `algorithm.name` picks; a worker process that dies is
    recovered from the last checkpoint up to `runner.max_restarts` times (`runtime/recovery.py`)."""
    from rlinf_like.algorithms.embodied import runner_class
    from rlinf_like.runners.restarts import train_with_restarts
    from rlinf_like.runtime.errors import WorkerDiedError

    def run_once(run_cfg, on: Cluster | None) -> dict:
        runner = runner_class(run_cfg.algorithm.name)(run_cfg, on)
        try:
            return runner.run()
        except WorkerDiedError as err:  # the updates done since the checkpoint: what a restart replays
            err.run_step = runner.iteration
            raise

    return train_with_restarts(cfg, cluster, run_once)
