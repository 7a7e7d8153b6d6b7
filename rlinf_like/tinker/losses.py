"""The losses a Tinker client names in `forward_backward`, over our model.

Tinker's data arrive shifted already: position i of a datum's tokens predicts `target_tokens[i]`. Every loss is a
sum over tokens (not a mean), weighted per token, and every call returns each datum's per-token logprobs of its
targets, which the client's recipes compute their metrics from. Policy-gradient losses read the sampler's
logprobs and per-token advantages:

* `cross_entropy`: -sum(w * logp)
* `importance_sampling`: -sum(exp(logp - q) * A), the ratio not clipped
* `ppo`: -sum(min(r * A, clip(r, low, high) * A)), r = exp(logp - q)
* `cispo`: -sum(sg(clip(r, low, high)) * A * logp), the clipped ratio as a weight, no gradient through it

`low` and `high` are the ratio's bounds (`clip_low_threshold`, `clip_high_threshold`; 0.8 and 1.2 unless given).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from rlinf_like.hybrid_engines.model_manager import token_stats
from rlinf_like.hybrid_engines.prompt_sharing import common_prefixes, share_batch
from rlinf_like.workers.reward.model import pad_rows

LOSSES = ("cross_entropy", "importance_sampling", "ppo", "cispo")
# each loss's inputs besides `target_tokens`, and which of them may be left out (a weight of 1)
INPUTS = {"cross_entropy": ("weights",), "importance_sampling": ("logprobs", "advantages"),
          "ppo": ("logprobs", "advantages"), "cispo": ("logprobs", "advantages")}
CLIP = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}


class UnsupportedLoss(ValueError):
    """What this server does not implement (a loss, a loss input, an image chunk, a sampling option): refused by
    name at the call."""


@dataclass
class Datum:
    tokens: list[int]  # the model input, text chunks joined
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # loss_fn_inputs, each one value per token


def check_loss(loss_fn: str, config: dict | None, data: Sequence[Datum]) -> dict[str, float]:
    """The loss's clip bounds; an error naming what is wrong when the loss, its config or an input is not one this
    server knows or a datum's inputs do not match its tokens."""
    if loss_fn not in LOSSES:
        raise UnsupportedLoss(f"loss_fn={loss_fn!r} is not supported here; supported: {list(LOSSES)}")
    config = dict(config or {})
    unknown = set(config) - set(CLIP)
    if unknown or (config and loss_fn not in ("ppo", "cispo")):
        raise UnsupportedLoss(f"loss_fn_config {sorted(config)} is not understood for {loss_fn!r}; "
                              f"ppo and cispo take {sorted(CLIP)}")
    for i, datum in enumerate(data):
        needed = {"target_tokens", *INPUTS[loss_fn]} - ({"weights"} if loss_fn == "cross_entropy" else set())
        missing, extra = needed - set(datum.inputs), set(datum.inputs) - {"target_tokens", *INPUTS[loss_fn]}
        if missing or extra:
            raise UnsupportedLoss(f"datum {i}: {loss_fn!r} needs loss_fn_inputs {sorted(needed)}"
                                  + (f", missing {sorted(missing)}" if missing else "")
                                  + (f", not understood {sorted(extra)}" if extra else ""))
        for name, value in datum.inputs.items():
            if value.shape != (len(datum.tokens),):
                raise UnsupportedLoss(f"datum {i}: loss_fn_inputs[{name!r}] has shape {tuple(value.shape)}, the "
                                      f"model input has {len(datum.tokens)} tokens")
    return {**CLIP, **config}


def target_logprobs(model: nn.Module, data: Sequence[Datum], share_pairs: float | None = None,
                    graded: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """Per datum, log p(target_tokens[i] | tokens[:i+1]) for each position i, in float32, with the gradient.

    Where every datum's targets are its own tokens shifted by one (as the cookbook builds them), the rows run through
    the trainer's `token_stats`, and with `share_pairs` (the actor shares prompts, `actor.loop.share_prompt`) the
    data that begin alike, a GRPO group's samples, run their common prefix once (`prompt_sharing.common_prefixes`):
    the same numbers up to float rounding, as in RL training. `graded` (per datum, a bool per token): the positions
    whose logprobs the loss differentiates; the others' are computed without a gradient (values only)."""
    device = next(model.parameters()).device
    if not all(d.inputs["target_tokens"][:-1].tolist() == d.tokens[1:] for d in data):
        return _any_target_logprobs(model, data, device)
    rows = [d.tokens + [int(d.inputs["target_tokens"][-1])] for d in data]
    ids, mask = pad_rows(rows, 0)
    batch = {"input_ids": ids.to(device), "attention_mask": mask.to(device)}
    if graded is not None:
        batch["grad_mask"] = pad_rows([g.tolist() for g in graded], False)[0].bool().to(device)
    if share_pairs is not None:
        batch["prompt_lengths"] = torch.tensor(common_prefixes(rows, share_pairs), device=device)
        batch = share_batch(batch, share_pairs)
    logprobs, _ = token_stats(model, batch)
    return [logprobs[row, : len(d.tokens)] for row, d in enumerate(data)]


def _any_target_logprobs(model: nn.Module, data: Sequence[Datum], device: torch.device) -> list[torch.Tensor]:
    """`target_logprobs` for targets that are not the next tokens: every position's logits, one row at a time."""
    ids, mask = pad_rows([d.tokens for d in data], 0)
    out = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
    logits = out.logits if hasattr(out, "logits") else out
    result = []
    for row, datum in enumerate(data):  # one row's log-softmax at a time: [tokens, vocab] in float32, not [B, T, V]
        n = len(datum.tokens)
        logp = torch.log_softmax(logits[row, :n].float(), dim=-1)
        result.append(logp.gather(-1, datum.inputs["target_tokens"].long().to(device).unsqueeze(-1)).squeeze(-1))
    return result


def elementwise_loss(loss_fn: str, logp: torch.Tensor, inputs: dict[str, torch.Tensor],
                     clip: dict[str, float]) -> torch.Tensor:
    """One datum's per-token loss (its sum is the datum's loss)."""
    if loss_fn == "cross_entropy":
        weights = inputs.get("weights")
        return -logp * (1.0 if weights is None else weights.to(logp))
    advantages, sampled = inputs["advantages"].to(logp), inputs["logprobs"].to(logp)
    ratio = torch.exp(logp - sampled)
    if loss_fn == "importance_sampling":
        return -ratio * advantages
    clipped = ratio.clamp(clip["clip_low_threshold"], clip["clip_high_threshold"])
    if loss_fn == "ppo":
        return -torch.minimum(ratio * advantages, clipped * advantages)
    return -clipped.detach() * advantages * logp  # cispo


def differentiated(loss_fn: str, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The tokens whose logprob the loss's gradient reaches: a weight or an advantage of exactly 0 makes that
    token's term (and its gradient) 0 in every loss above (the prompt positions of an RL datum)."""
    coefficient = inputs.get("weights") if loss_fn == "cross_entropy" else inputs["advantages"]
    if coefficient is None:
        return torch.ones(len(inputs["target_tokens"]), dtype=torch.bool)
    return coefficient != 0


def loss_closure(data: Sequence[Datum], loss_fn: str, config: dict | None,
                 outputs: list[dict[str, torch.Tensor]], share_pairs: float | None = None):
    """A `ModelManager.forward_backward` loss: the loss summed over every datum's tokens; per datum its `logprobs`
    and `elementwise_loss` are appended to `outputs`. The loss and its inputs are checked first."""
    clip = check_loss(loss_fn, config, data)

    def loss(model: nn.Module, _batch) -> tuple[torch.Tensor, dict[str, float]]:
        logprobs = target_logprobs(model, data, share_pairs, [differentiated(loss_fn, d.inputs) for d in data])
        losses = [elementwise_loss(loss_fn, lp, d.inputs, clip) for lp, d in zip(logprobs, data, strict=True)]
        outputs.extend({"logprobs": lp.detach().cpu(), "elementwise_loss": el.detach().cpu()}
                       for lp, el in zip(logprobs, losses, strict=True))
        return torch.stack([el.sum() for el in losses]).sum(), {}

    return loss
