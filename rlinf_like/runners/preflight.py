"""Preflight: every check a run makes before it starts Ray or a worker, without starting them.

A reasoning run checks its config, loads its data, writes or finds its model, loads the tokenizer, renders the
prompt format, builds the advantage estimator and plans the placement; an embodied run checks its config and plans
its placement. `preflight(cfg)` does exactly that, through the same constructors and the same `plan` functions
the runs call, on the devices the config describes (this machine's, as a local cluster would see them). It is
how a config is checked in about a second, e.g. for every command line the docs show.
"""

from __future__ import annotations

from rlinf_like.runtime import Placement, devices_of


def preflight(cfg) -> Placement:
    """The checks of a run of `cfg` (a ReasoningConfig or an EmbodiedConfig) up to its first worker; the placement."""
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    if isinstance(cfg, ReasoningConfig):
        return _reasoning(cfg)
    return _embodied(cfg)


def _reasoning(cfg) -> Placement:
    from rlinf_like.runners.reasoning.launch import plan
    from rlinf_like.runners.reasoning import schedule_of
    from rlinf_like.runners.reasoning.run import ReasoningRun
    from rlinf_like.runners.reasoning.schedules import SCHEDULES

    run = ReasoningRun(cfg)  # config, data, model folder, tokenizer, prompt format, estimator
    check = SCHEDULES.get(schedule_of(cfg)).placement_check()
    placement, _ = plan(cfg, devices_of(cfg.cluster), run.estimator, check)
    return placement


def _embodied(cfg) -> Placement:
    from rlinf_like.algorithms.embodied import runner_class

    runner = runner_class(cfg.algorithm.name)(cfg)  # its config checks
    placement, _ = runner.plan(devices_of(cfg.cluster))
    return placement
