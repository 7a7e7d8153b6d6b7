"""The embodied algorithm registry (`algorithm.name`): each algorithm declares what it can train, so the
checks refuse a pairing before any worker starts, naming the key, and never branch on a name.

Adding one: register an `EmbodiedAlgorithm` with its runner's import path.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_like.algorithms.registry import Registry


@dataclass(frozen=True, kw_only=True)
class EmbodiedAlgorithmSpec:
    runner: str  # "module:Class" of the runner that trains it
    on_policy: bool  # trains on the last rollout only (else from a replay buffer)
    action_kinds: tuple[str, ...]  # ActionSpec.kind values it can act in
    policy_kinds: tuple[str, ...] | None  # policy.kind values it trains (None: any registered policy)
    reads_advantage: bool  # algorithm.advantage picks its advantage estimator
    why_not: str = ""  # what the refusal of other policy kinds says
    description: str = ""


EMBODIED_ALGORITHMS: Registry[EmbodiedAlgorithmSpec] = Registry("embodied algorithm", key="algorithm.name")
EMBODIED_ALGORITHMS.register("ppo", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied:EmbodiedRunner", on_policy=True, action_kinds=("continuous", "discrete"),
    policy_kinds=None, reads_advantage=True, description="PPO actor-critic (GAE, or GRPO over episode groups)"))
EMBODIED_ALGORITHMS.register("sac", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied_sac:EmbodiedSACRunner", on_policy=False, action_kinds=("continuous",),
    policy_kinds=("mlp",), reads_advantage=False,
    why_not=("SAC here is the continuous, tanh-squashed Gaussian variant with twin Q(s, a) critics over state "
             "observations. The VLA acts with discrete action tokens, one categorical per action dimension "
             "(policy.bins ** dims joint actions); a discrete SAC would need a critic giving Q for every joint token "
             "(or a factorised one) and a pixel encoder shared with the critics, which is not built: train the VLA "
             "with algorithm.name=ppo (algorithm.advantage=gae or grpo)"),
    description="soft actor-critic with a replay worker, twin Q, Polyak targets, automatic entropy tuning"))


def embodied_algorithm(name: str) -> EmbodiedAlgorithmSpec:
    return EMBODIED_ALGORITHMS.get(name)


def embodied_estimators() -> list[str]:
    """The advantage estimators that declare they work on episode returns (`AdvantageEstimator.embodied`)."""
    from rlinf_like.algorithms.advantage_estimators import ADVANTAGE_ESTIMATORS

    return [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).embodied]


def check_embodied_algorithm(name: str, policy_kind: str, advantage: str = "gae") -> EmbodiedAlgorithmSpec:
    """The algorithm `algorithm.name=name`, refused with its reason if it cannot train `policy.kind`, and its
    `algorithm.advantage` refused unless the estimator declares it works on episodes."""
    spec = embodied_algorithm(name)
    if spec.reads_advantage and advantage not in embodied_estimators():
        raise ValueError(f"algorithm.advantage={advantage!r} is not one of {embodied_estimators()} (the advantage "
                         f"estimators that declare `embodied`)")
    if not spec.reads_advantage and advantage != "gae":
        raise ValueError(f"algorithm.advantage={advantage!r}: algorithm.name={name} reads no advantage estimator "
                         "(leave it at gae)")
    if spec.policy_kinds is not None and policy_kind not in spec.policy_kinds:
        raise ValueError(f"algorithm.name={name} trains policy.kind in {list(spec.policy_kinds)}, not "
                         f"{policy_kind!r}: {spec.why_not}")
    return spec


def runner_class(name: str) -> type:
    """The runner class that trains `algorithm.name=name` (imported on first use)."""
    import importlib

    module, _, attr = embodied_algorithm(name).runner.partition(":")
    return getattr(importlib.import_module(module), attr)
