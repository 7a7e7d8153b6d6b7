"""Data sources (`data.source`): each turns the `data` section into `Tasks`, before any worker starts.

A source is a `DataSource` subclass registered in `DATA_SOURCES` by import path. It declares the
`data.*` keys it reads (the checks refuse another source's key set away from its default) and the
reward function that scores its answers when `reward.fn=auto`.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.utils.registry import Registry

log = logging.getLogger(__name__)
DATA_SOURCES: Registry[type[DataSource]] = Registry("data source", key="data.source")
DATA_SOURCES.register("arithmetic", "rlinf_like.data.sources.arithmetic:ArithmeticSource")
DATA_SOURCES.register("files", "rlinf_like.data.sources.files:FileSource")
DATA_SOURCES.register("reasoning_gym", "rlinf_like.data.sources.reasoning_gym:ReasoningGymSource")
DATA_SOURCES.register("ifeval_train", "rlinf_like.data.sources.ifeval_train:IFEvalTrainSource")  # IFEval-style constraints
DATA_SOURCES.register("verifiers", "rlinf_like.data.sources.verifiers:VerifiersSource")  # a verifiers env's tasks


def check_data_config(cfg) -> None:
    """`data.source` by name, the keys its source reads by what it declares, and the prompt format; before
    any worker starts, naming the key. A command line that changed `data.source` (`config.cli.user_overrides`) drops,
    with one log line, what the preset set for its own source; a key the user set for another source is refused."""
    from rlinf_like.config.cli import user_overrides
    from rlinf_like.data.config import DataConfig

    if cfg.source not in DATA_SOURCES:
        raise ValueError(f"data.source={cfg.source!r} is not one of {DATA_SOURCES.names()}")
    reads = DATA_SOURCES.get(cfg.source).keys
    defaults = DataConfig()
    user = user_overrides()
    dropped = []
    for other in DATA_SOURCES.names():
        for key in DATA_SOURCES.get(other).keys:
            if key in reads or getattr(cfg, key) == getattr(defaults, key):
                continue
            if user is not None and "data.source" in user and f"data.{key}" not in user:
                dropped.append(f"data.{key}={getattr(cfg, key)!r}")
                setattr(cfg, key, getattr(defaults, key))
                continue
            raise ValueError(f"data.{key}={getattr(cfg, key)!r} is read by data.source={other}; "
                             f"data.source={cfg.source} does not read it")
    if dropped:
        log.info(f"data.source={cfg.source} (set on the command line): dropped the preset's {', '.join(dropped)}, "
                 "which only other sources read")
    if cfg.chat_template not in ("auto", "none") and not Path(cfg.chat_template).is_file():
        raise ValueError(f"data.chat_template={cfg.chat_template!r} must be auto, none or a Jinja template file "
                         f"that exists")


def default_reward(cfg) -> str:
    """The reward function that scores `cfg`'s source (what reward.fn=auto means)."""
    return DATA_SOURCES.get(cfg.source).default_reward


def load_tasks(cfg) -> Tasks:
    """The problems `cfg` (the `data` section) names: train, held-out and the RL pool."""
    tasks = DATA_SOURCES.get(cfg.source).load(cfg)
    for what, problems in (("RL steps", tasks.pool), ("the held-out evaluation", tasks.test)):
        if not problems:  # else the run would fail only after its workers started
            sizes = ", ".join(f"data.{k}={getattr(cfg, k)!r}" for k in DATA_SOURCES.get(cfg.source).keys)
            raise ValueError(f"data.source={cfg.source} gives {what} no problems to draw from ({sizes})")
    return tasks


__all__ = ["DATA_SOURCES", "DataSource", "Tasks", "check_data_config", "default_reward", "load_tasks"]
