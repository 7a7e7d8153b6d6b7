"""The embodied algorithm registry (`algorithm.name`): each algorithm declares what it can train, so the
checks refuse a pairing before any worker starts, naming the key, and never branch on a name.

Adding one: register an `EmbodiedAlgorithmSpec` with its runner's import path and the section of
`algorithm` (a field of the schema's `EmbodiedAlgorithm`) that holds the keys only it reads.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

from rlinf_like.algorithms.registry import Registry
from rlinf_like.utils.registry import import_ref
from rlinf_like.envs.base import ActionSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EmbodiedAlgorithmSpec:
    runner: str  # "module:Class" of the runner that trains it
    section: str  # the algorithm.<section> it reads its own keys from; other algorithms refuse them set
    on_policy: bool  # trains on the last rollout only (else from a replay buffer)
    action_kinds: tuple[str, ...]  # ActionSpec.kind values it can act in
    policy_kinds: tuple[str, ...] | None  # policy.kind values it trains (None: any registered policy)
    reads_advantage: bool  # algorithm.<section>.advantage picks its advantage estimator
    why_not: str = ""  # what the refusal of other policy kinds says
    description: str = ""


EMBODIED_ALGORITHMS: Registry[EmbodiedAlgorithmSpec] = Registry("embodied algorithm", key="algorithm.name")
EMBODIED_ALGORITHMS.register("ppo", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied.runner:EmbodiedRunner", section="ppo", on_policy=True,
    action_kinds=("continuous", "discrete"), policy_kinds=None, reads_advantage=True,
    description="PPO actor-critic (GAE, or GRPO over episode groups)"))
EMBODIED_ALGORITHMS.register("sac", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied.sac:EmbodiedSACRunner", section="sac", on_policy=False,
    action_kinds=("continuous",), policy_kinds=("mlp",), reads_advantage=False,
    why_not=("SAC here is the continuous, tanh-squashed Gaussian variant with twin Q(s, a) critics over state "
             "observations; the VLA acts in discrete action tokens: train it with algorithm.name=discrete_sac "
             "(or ppo)"),
    description="soft actor-critic with a replay worker, twin Q, Polyak targets, automatic entropy tuning"))
EMBODIED_ALGORITHMS.register("discrete_sac", EmbodiedAlgorithmSpec(
    runner="rlinf_like.runners.embodied.sac:EmbodiedDiscreteSACRunner", section="sac", on_policy=False,
    action_kinds=("discrete",), policy_kinds=("mlp", "vla"), reads_advantage=False,
    why_not="discrete SAC reads a policy's action-token logits (`action_logits`), which only mlp and vla give",
    description=("SAC for discrete actions and action tokens (Christodoulou 2019): twin Q per token and choice, "
                 "exact expectations over the categoricals, the same replay worker, sync and checkpoints as sac")))


def embodied_algorithm(name: str) -> EmbodiedAlgorithmSpec:
    return EMBODIED_ALGORITHMS.get(name)


def embodied_estimators() -> list[str]:
    """The advantage estimators that declare they work on episode returns (`AdvantageEstimator.embodied`)."""
    from rlinf_like.algorithms.advantage_estimators import ADVANTAGE_ESTIMATORS

    return [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).embodied]


def check_embodied_algorithm(algorithm: Any, policy_kind: str) -> EmbodiedAlgorithmSpec:
    """The algorithm `algorithm.name` (`algorithm`: the config's section), refused with its reason if it cannot
    train `policy.kind`; its `advantage` refused unless the estimator declares it works on episodes; another
    algorithm's keys set away from their defaults refused (`check_other_sections`)."""
    spec = embodied_algorithm(algorithm.name)
    check_other_sections(algorithm, spec)
    advantage = getattr(getattr(algorithm, spec.section), "advantage", None)
    if spec.reads_advantage and advantage not in embodied_estimators():
        raise ValueError(f"algorithm.{spec.section}.advantage={advantage!r} is not one of {embodied_estimators()} "
                         f"(the advantage estimators that declare `embodied`)")
    if spec.policy_kinds is not None and policy_kind not in spec.policy_kinds:
        raise ValueError(f"algorithm.name={algorithm.name} trains policy.kind in {list(spec.policy_kinds)}, not "
                         f"{policy_kind!r}: {spec.why_not}")
    return spec


def _changed(section: Any, default: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """(dotted key, value, default) of every leaf of `section` that differs from `default`'s."""
    out = []
    for f in dataclasses.fields(section):
        mine, theirs = getattr(section, f.name), getattr(default, f.name)
        if dataclasses.is_dataclass(theirs):
            out += _changed(mine, theirs, f"{prefix}{f.name}.")
        elif mine != theirs:
            out.append((f"{prefix}{f.name}", mine, theirs))
    return out


def _given(key: str, keys: set[str]) -> bool:
    """`key` or a section above it is among `keys`."""
    parts = key.split(".")
    return any(".".join(parts[:depth]) in keys for depth in range(1, len(parts) + 1))


def check_other_sections(algorithm: Any, spec: EmbodiedAlgorithmSpec) -> None:
    """A key of a section only other algorithms read (`EmbodiedAlgorithmSpec.section`), set away from its default,
    would do nothing: refused, naming the key and the algorithms that read it. Started from a command line, only
    its key=value overrides count: a preset's tuning of another algorithm (an env preset written for PPO, run with
    algorithm.name=sac) is set back to the defaults, in one log line."""
    from rlinf_like.config.cli import command_line_keys

    given, dropped = command_line_keys(), []
    specs = {n: EMBODIED_ALGORITHMS.get(n) for n in EMBODIED_ALGORITHMS.names()}
    for section in sorted({s.section for s in specs.values()} - {spec.section}):
        value = getattr(algorithm, section)
        changed = _changed(value, type(value)(), f"algorithm.{section}.")
        for key, mine, default in changed:
            if given is None or _given(key, given):
                readers = [n for n, s in specs.items() if s.section == section]
                raise ValueError(f"{key}={mine!r} is read by algorithm.name in {readers}; algorithm.name="
                                 f"{algorithm.name} reads algorithm.{spec.section}: leave it at its default "
                                 f"{default!r}")
        if changed:
            setattr(algorithm, section, type(value)())
            dropped += [f"{key}={mine!r}" for key, mine, _ in changed]
    if dropped:
        log.info(f"algorithm.name={algorithm.name}: dropped the preset's {', '.join(dropped)}, which only other "
                 "algorithms read")


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
