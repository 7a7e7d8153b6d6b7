"""The embodied algorithm registry (`algorithm.name`): each algorithm declares what it can train, so the
checks refuse a pairing before any worker starts, naming the key, and never branch on a name.

Adding one: register an `EmbodiedAlgorithm` with its runner's import path.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_like.algorithms.registry import Registry
from rlinf_like.utils.registry import import_ref
from rlinf_like.envs.base import ActionSpec


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
    runner="rlinf_like.runners.embodied.runner:EmbodiedRunner", on_policy=True, action_kinds=("continuous", "discrete"),
    policy_kinds=None, reads_advantage=True, description="PPO actor-critic (GAE, or GRPO over episode groups)"))
EMBODIED_ALGORITHMS.register("sac", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied.sac:EmbodiedSACRunner", on_policy=False, action_kinds=("continuous",),
    policy_kinds=("mlp",), reads_advantage=False,
    why_not=("SAC here is the continuous, tanh-squashed Gaussian variant with twin Q(s, a) critics over state "
             "observations; the VLA acts in discrete action tokens: train it with algorithm.name=discrete_sac "
             "(or ppo)"),
    description="soft actor-critic with a replay worker, twin Q, Polyak targets, automatic entropy tuning"))
EMBODIED_ALGORITHMS.register("discrete_sac", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied.sac:EmbodiedDiscreteSACRunner", on_policy=False, action_kinds=("discrete",),
    policy_kinds=("mlp", "vla"), reads_advantage=False,
    why_not="discrete SAC reads a policy's action-token logits (`action_logits`), which only mlp and vla give",
    description=("SAC for discrete actions and action tokens (Christodoulou 2019): twin Q per token and choice, "
                 "exact expectations over the categoricals, the same replay worker, sync and checkpoints as sac")))


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


def _trains(spec: EmbodiedAlgorithmSpec, policy_kind: str, action_kind: str) -> bool:
    return action_kind in spec.action_kinds and (spec.policy_kinds is None or policy_kind in spec.policy_kinds)


def check_action_kind(name: str, policy_kind: str, action: ActionSpec) -> EmbodiedAlgorithmSpec:
    """Refuse `algorithm.name=name` when `policy.kind` acts in another kind of action on this env (the VLA acts
    in discrete tokens whatever the env takes), naming the algorithms that would train it."""
    from rlinf_like.models.policies import policy_class

    spec, kind = embodied_algorithm(name), policy_class(policy_kind).action_kind(action)
    if kind not in spec.action_kinds:
        others = [n for n in EMBODIED_ALGORITHMS.names() if _trains(EMBODIED_ALGORITHMS.get(n), policy_kind, kind)]
        raise ValueError(f"algorithm.name={name} acts in {list(spec.action_kinds)} actions; policy.kind={policy_kind} "
                         f"acts in {kind} ones on this env (its actions are {action.kind}): algorithm.name in "
                         f"{others} trains it")
    return spec


def runner_class(name: str) -> type:
    """The runner class that trains `algorithm.name=name` (imported on first use)."""
    return import_ref(embodied_algorithm(name).runner)
