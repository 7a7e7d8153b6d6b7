"""`Workers`: the groups a reasoning run launched, as the schedules and phases reach them."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_like.runtime import Placement, WorkerGroup


@dataclass(kw_only=True)
class Workers:
    placement: Placement
    actor: WorkerGroup
    actor_dp: list  # per actor rank: its data-parallel replica (rank, size)
    rollout: WorkerGroup
    reward: WorkerGroup
    critic: WorkerGroup | None = None  # with an estimator that needs_critic
    reference: WorkerGroup | None = None  # with algorithm.kl_beta > 0, launched by `launch_reference`
    reference_in_actor: bool = False  # LoRA with algorithm.kl_beta > 0: the actor's base is the reference
    teacher: WorkerGroup | None = None  # with an estimator that needs_teacher (opd)
    judge: WorkerGroup | None = None  # with reward.fn=judge
    collocated: bool  # actor and rollout share devices: they take turns

    @property
    def trainers(self) -> list[WorkerGroup]:
        """The trained groups that give their devices to the rollout in collocated mode."""
        return [self.actor] + ([self.critic] if self.critic is not None else [])

    def all_groups(self) -> dict[str, WorkerGroup | None]:
        return {"actor": self.actor, "critic": self.critic, "rollout": self.rollout, "reward": self.reward,
                "reference": self.reference, "teacher": self.teacher, "judge": self.judge}
