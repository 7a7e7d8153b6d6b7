"""On-policy distillation: the student samples, a teacher scores every sampled token, and each token's advantage
is the negative reverse-KL estimate log p_teacher(token) - log p_student(token) (Agarwal et al. 2024, GKD; the
Qwen3 recipe; Thinking Machines' "On-Policy Distillation"). A token the teacher finds likelier than the student
did is pushed up, one it finds less likely is pushed down; the usual clipped policy loss applies. Optionally
mixed with the task reward's group-relative advantage (`reward_weight`), broadcast over the response.

No discounting: each token's advantage is its own (the reverse KL is summed per token, as in the write-ups)."""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_like.algorithms.advantage_estimators.base import ADVANTAGE_ESTIMATORS, AdvantageEstimator, AdvantageInputs, Advantages
from rlinf_like.algorithms.advantage_estimators.grpo import grpo_advantages
from rlinf_like.config.validate import bounded


@dataclass(kw_only=True)
class OPDOptions:
    # weight of the task reward's GRPO advantage added to every response token; 0: distillation alone
    reward_weight: float = bounded(0.0, ge=0)


@ADVANTAGE_ESTIMATORS.register("opd")
class OnPolicyDistillation(AdvantageEstimator):
    needs_teacher = True
    token_level = True
    Options = OPDOptions

    def needs_group(self) -> bool:
        return self.options.reward_weight > 0  # the task reward's part is group-relative

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        mask = inputs.response_mask
        gap = (inputs.teacher_logprobs - inputs.logprobs) * mask  # -(log p_student - log p_teacher)
        tokens = mask.sum().clamp(min=1)
        metrics = {"opd/reverse_kl": float(-gap.sum() / tokens)}  # the student's per-token reverse KL estimate
        advantages = gap
        if self.options.reward_weight:
            per_response = grpo_advantages(inputs.rewards).reshape(-1, 1)
            advantages = advantages + self.options.reward_weight * per_response * mask
        return Advantages(advantages=advantages, metrics=metrics)
