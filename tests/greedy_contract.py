"""The native engine's exactness contract (docs/architecture.md, "Rollout numerics"), as test helpers.

float32: greedy tokens equal transformers' and logprobs agree to 1e-4. bfloat16: no two bf16 implementations agree
to the last token (transformers' own bf16 tokens change with the batch's padding), so greedy tokens must equal
transformers' bf16 tokens up to their first difference, and there the two tokens must be a near tie under the
float32 model (their float32 logprobs within `TIE_NATS`); logprobs are compared with the float32 model's on the
tokens the engine drew.
"""

from __future__ import annotations

import torch

TIE_NATS = 0.3  # bf16 keeps 8 bits of mantissa: logits of ~10 move by ~0.06, a difference of a few such steps
# hidden-64 random models: their bf16 scores round coarsely; the fp32 model's logprob of the token the engine chose fell
# up to 0.56 nats below its best (transformers' bf16: 0.26); on SmolLM2 the two engines' bf16 errors are alike
TINY_TIE_NATS = 0.6
FP32_LOGPROB_TOL = 1e-4


def fp32_logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax of the float32 model's next-token logits at each response position [len(tokens), V]."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    return logits.float().log_softmax(-1)


def assert_greedy_contract(ours, reference, dtype: str, fp32_model=None, tie_nats: float = TIE_NATS) -> list[int]:
    """Check `ours` against transformers' `reference` results (same requests, one sample each) for `dtype`;
    returns how many tokens of each response agreed before the first difference."""
    agreed = []
    for a, b in zip(ours, reference):
        x, y = a.response_ids[0], b.response_ids[0]
        same = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
        agreed.append(same)
        if dtype == "float32":
            assert x == y, a.request_id
            assert max(abs(p - q) for p, q in zip(a.logprobs[0], b.logprobs[0])) < FP32_LOGPROB_TOL, a.request_id
            continue
        if same < min(len(x), len(y)):  # a difference: only at a near tie
            lp = fp32_logprobs(fp32_model, list(a.prompt_ids), x[:same + 1])[same]
            gap = abs(float(lp[x[same]] - lp[y[same]]))
            assert gap < tie_nats, (a.request_id, same, gap)
    return agreed
