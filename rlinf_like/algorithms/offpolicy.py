"""Off-policy corrections between the three log-probabilities of a token, named as in AReaL's decoupled PPO
(Fu et al. 2025, "AReaL: a large-scale asynchronous RL system", eq. 5):

- **behaviour**: what the rollout engine sampled with (the batch's `old_logprobs`);
- **proximal**: the trainer's recomputation under the weights of the version that started this step
  (`recomputed_logprobs`, with `algorithm.recompute_logprobs=true`);
- **current**: the trainer's logprobs under the weights being trained.

`POLICY_LOSSES` (`actor.loss.objective`) says which of them a policy objective reads; `IS_CORRECTIONS`
(`actor.loss.is_correction`) turns the proximal/behaviour ratio into per-token weights and a loss mask;
`mismatch_metrics` describes that ratio. All pure tensor functions over [rows, tokens] with a response mask.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf_like.algorithms.losses import KL_ESTIMATORS
from rlinf_like.algorithms.masked import masked_mean
from rlinf_like.algorithms.registry import Registry


# --- policy objectives -------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PolicyObjective:
    """What a policy loss reads, declared so the checks need no names. The clipped surrogate itself is
    `losses.policy_loss` for both: they differ in the ratio's denominator and the per-token weight."""

    needs_proximal: bool  # refused without algorithm.recompute_logprobs=true
    behaviour_weighted: bool  # every token weighs proximal/behaviour (as corrected); else only under a correction
    description: str


POLICY_LOSSES: Registry[PolicyObjective] = Registry("policy loss", key="actor.loss.objective")
POLICY_LOSSES.register("ppo", PolicyObjective(
    needs_proximal=False, behaviour_weighted=False,
    description="clip current / old, old = proximal when recomputed, else behaviour (the default)"))
POLICY_LOSSES.register("decoupled_ppo", PolicyObjective(
    needs_proximal=True, behaviour_weighted=True,
    description="AReaL's decoupled PPO: clip current / proximal, weigh each token by proximal / behaviour"))


# --- importance-sampling corrections -----------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ISThresholds:
    """The corrections' thresholds (the `actor.loss.is_*` keys); each correction reads the ones it declares."""

    cap: float = 2.0  # tis
    low: float = 0.5  # mis, icepop, seq_mask: the accepted ratio range [low, high]
    high: float = 2.0


@dataclass(frozen=True, kw_only=True)
class Correction:
    weights: torch.Tensor  # [rows, tokens] detached per-token weights of the policy loss; 0 where masked
    mask: torch.Tensor  # [rows, tokens] the tokens the policy loss averages over


@dataclass(frozen=True, kw_only=True)
class ISCorrection:
    fn: Callable[[torch.Tensor, torch.Tensor, ISThresholds], Correction]
    options: tuple[str, ...]  # the actor.loss.* keys it reads (others' keys are refused when set)
    reweights: bool  # False only for `none`: a loss that is not behaviour-weighted then uses no weights
    needs_proximal: bool  # refused without algorithm.recompute_logprobs=true


IS_CORRECTIONS: Registry[ISCorrection] = Registry("importance-sampling correction", key="actor.loss.is_correction")


def correction(name: str, *, options: tuple[str, ...] = (), reweights: bool = True, needs_proximal: bool = True):
    """Registers `fn(log_ratio, mask, thresholds) -> Correction` under `name`, with what it declares."""

    def add(fn):
        IS_CORRECTIONS.register(name, ISCorrection(fn=fn, options=options, reweights=reweights,
                                                  needs_proximal=needs_proximal))
        return fn

    return add


def _ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.detach())


def _in_range(ratio: torch.Tensor, t: ISThresholds) -> torch.Tensor:
    return ((ratio >= t.low) & (ratio <= t.high)).to(ratio.dtype)


@correction("none", reweights=False, needs_proximal=False)
def no_correction(log_ratio: torch.Tensor, mask: torch.Tensor, t: ISThresholds) -> Correction:
    """The plain ratio proximal/behaviour: what decoupled PPO weighs by when nothing is corrected."""
    return Correction(weights=_ratio(log_ratio) * mask, mask=mask)


@correction("tis", options=("is_cap",))
def truncated_is(log_ratio: torch.Tensor, mask: torch.Tensor, t: ISThresholds) -> Correction:
    """Token-level truncated IS: min(ratio, cap); every token stays in the loss."""
    return Correction(weights=_ratio(log_ratio).clamp(max=t.cap) * mask, mask=mask)


@correction("mis", options=("is_low", "is_high"))
def masked_is(log_ratio: torch.Tensor, mask: torch.Tensor, t: ISThresholds) -> Correction:
    """Masked IS: a token whose ratio is outside [low, high] leaves the loss (and its average's count)."""
    ratio = _ratio(log_ratio)
    keep = _in_range(ratio, t) * mask
    return Correction(weights=ratio * keep, mask=keep)


@correction("icepop", options=("is_low", "is_high"))
def icepop(log_ratio: torch.Tensor, mask: torch.Tensor, t: ISThresholds) -> Correction:
    """IcePop (the Ling team's Ring-1T report, "Every Step Evolves", arXiv 2510.18855), as followed here from
    its restatement in the INTELLECT-3 report (arXiv 2512.16144, eq. 1, quoted in prime-rl PR #2401) and the
    Ring team's blog on the training-inference mismatch: M(k) = k for k = pi_train / pi_infer in [low, high],
    else 0, the gradient of a masked token stopped, and the average still over all tokens (1 / sum |y|):
    unlike `mis` the masked tokens stay in the count. (Those use [0.2, 5] or [0.5, 5]; the default range here
    is the one `mis` and `seq_mask` share.)"""
    ratio = _ratio(log_ratio)
    return Correction(weights=ratio * _in_range(ratio, t) * mask, mask=mask)


@correction("seq_mask", options=("is_low", "is_high"))
def sequence_mask(log_ratio: torch.Tensor, mask: torch.Tensor, t: ISThresholds) -> Correction:
    """Sequence-level masking: a whole response leaves the loss when the geometric mean of its token ratios,
    exp(mean log ratio), is outside [low, high]; kept tokens weigh their own ratio."""
    ratio = _ratio(log_ratio)
    geo_mean = torch.exp(masked_mean(log_ratio.detach(), mask, dim=-1))
    keep = _in_range(geo_mean, t).unsqueeze(-1) * mask
    return Correction(weights=ratio * keep, mask=keep)


def apply_correction(name: str, log_ratio: torch.Tensor, mask: torch.Tensor, thresholds: ISThresholds) -> Correction:
    """`actor.loss.is_correction=name` on log(proximal / behaviour)."""
    return IS_CORRECTIONS.get(name).fn(log_ratio, mask.to(log_ratio.dtype), thresholds)


@dataclass(frozen=True, kw_only=True)
class PolicyTerms:
    old_logprobs: torch.Tensor  # the surrogate ratio's denominator
    weights: torch.Tensor | None  # per-token weights of the policy loss; None = unweighted
    mask: torch.Tensor  # the tokens the policy loss averages over


def policy_terms(loss: str, is_correction: str, thresholds: ISThresholds, *, behaviour: torch.Tensor,
                 proximal: torch.Tensor | None, mask: torch.Tensor) -> PolicyTerms:
    """What `actor.loss.objective` and `actor.loss.is_correction` make of a micro-batch's logprobs: the ratio's
    denominator, the weights and the loss mask. Without proximal logprobs (refused before launch where the
    loss or the correction needs them) it is the plain PPO on the behaviour logprobs."""
    objective, corr = POLICY_LOSSES.get(loss), IS_CORRECTIONS.get(is_correction)
    if proximal is None:
        return PolicyTerms(old_logprobs=behaviour, weights=None, mask=mask)
    if not (objective.behaviour_weighted or corr.reweights):  # today's PPO on recomputed logprobs
        return PolicyTerms(old_logprobs=proximal, weights=None, mask=mask)
    c = apply_correction(is_correction, proximal - behaviour, mask, thresholds)
    return PolicyTerms(old_logprobs=proximal, weights=c.weights, mask=c.mask)


# --- diagnostics -------------------------------------------------------------------------------------------
PERCENTILES = (1, 50, 99)


def mismatch_metrics(proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor,
                     corrected: Correction | None = None) -> dict[str, float]:
    """How far the rollout's (behaviour) logprobs are from the trainer's (proximal), over valid tokens:
    KL(behaviour || proximal) by the k3 estimator on the rollout's samples, the absolute log ratio's mean and
    max, ratio percentiles, and with a correction the fractions of tokens it clipped (weight below the ratio,
    still in the loss) and masked (out of the loss or weight 0)."""
    valid = mask.bool()
    if not bool(valid.any()):
        return {}
    log_ratio = (proximal - behaviour).detach()[valid].double()
    ratio = torch.exp(log_ratio)
    kl = KL_ESTIMATORS.get("k3")(behaviour.detach()[valid].double(), proximal.detach()[valid].double())
    levels = torch.tensor([p / 100 for p in PERCENTILES], dtype=ratio.dtype, device=ratio.device)
    q = torch.quantile(ratio, levels)
    out = {"mismatch/kl_k3": float(kl.mean()), "mismatch/abs_log_ratio_mean": float(log_ratio.abs().mean()),
           "mismatch/abs_log_ratio_max": float(log_ratio.abs().max()),
           **{f"mismatch/ratio_p{p}": float(v) for p, v in zip(PERCENTILES, q)}}
    if corrected is not None:
        weights, kept = corrected.weights.detach()[valid], corrected.mask[valid] > 0
        masked = ~kept | (weights == 0)
        clipped = ~masked & (weights < _ratio(proximal - behaviour)[valid])  # the ratio as the correction saw it
        out["mismatch/masked_fraction"] = float(masked.double().mean())
        out["mismatch/clipped_fraction"] = float(clipped.double().mean())
    return out
