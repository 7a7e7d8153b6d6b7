"""Advantage estimators: one interface, one registry, one file each.

An estimator declares what it needs and gives (`needs_critic`, `needs_teacher`, `token_level`, `accepts_kl_in_reward`,
its settings as an `Options` dataclass: the section `algorithm.<name>`); the runner's checks and phases read
those declarations and never branch on an estimator's name. Adding one: a file in this package with a class
registered by `@ADVANTAGE_ESTIMATORS.register("name")`, imported below; one with Options also gets its section
in the runners' algorithm configs (a test checks that each has it).
"""

from rlinf_like.algorithms.advantage_estimators.base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    build_estimator,
    outcome_token_rewards,
)
from rlinf_like.algorithms.advantage_estimators import gae, grpo, opd, reinforce_pp, rloo  # noqa: F401  (registers)

__all__ = ["ADVANTAGE_ESTIMATORS", "AdvantageEstimator", "AdvantageInputs", "Advantages", "build_estimator",
           "outcome_token_rewards"]
