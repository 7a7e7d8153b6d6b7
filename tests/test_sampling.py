"""Sampling on fixed logits: the distribution drawn, filtering, and reproducibility per row."""

import torch

from rlinf_like.workers.rollout.sampling import RowParams, gumbel_argmax, sample, uniform_noise


def rows(b, temperature=1.0, top_k=0, top_p=1.0, seeds=None, step=0):
    return RowParams(torch.full((b,), temperature), torch.full((b,), top_k, dtype=torch.int64),
                     torch.full((b,), top_p), torch.arange(b) if seeds is None else seeds,
                     torch.full((b,), step, dtype=torch.int64))


LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))


def frequencies(tokens, vocab=5):
    return torch.bincount(tokens, minlength=vocab).double() / len(tokens)


def test_draws_follow_the_softmax_of_scaled_logits():
    n = 40_000
    tokens, logprobs = sample(LOGITS.expand(n, -1), rows(n))
    assert torch.allclose(frequencies(tokens), LOGITS.softmax(-1).double(), atol=0.01)
    assert torch.allclose(logprobs, LOGITS.log_softmax(-1)[tokens])
    hot, _ = sample(LOGITS.expand(n, -1), rows(n, temperature=2.0))
    assert torch.allclose(frequencies(hot), (LOGITS / 2).softmax(-1).double(), atol=0.01)


def test_top_k_and_top_p_cut_the_tail_and_renormalise():
    n = 20_000
    tokens, _ = sample(LOGITS.expand(n, -1), rows(n, top_k=2))
    assert torch.allclose(frequencies(tokens), torch.tensor([2 / 3, 1 / 3, 0, 0, 0]).double(), atol=0.015)
    tokens, _ = sample(LOGITS.expand(n, -1), rows(n, top_p=0.8))  # 0.5 + 0.25 < 0.8: keeps three tokens
    assert torch.allclose(frequencies(tokens), torch.tensor([0.5, 0.25, 0.15, 0, 0]).double() / 0.9, atol=0.015)


def test_greedy_rows_take_the_argmax_in_a_mixed_batch():
    params = rows(4)
    params.temperature[1] = 0.0
    tokens, logprobs = sample(torch.stack([LOGITS.flip(0)] * 4), params)
    assert tokens[1] == 4 and torch.isclose(logprobs[1], LOGITS.log_softmax(-1)[0])


def test_noise_depends_only_on_seed_and_step():
    a = uniform_noise(torch.tensor([3, 9]), torch.tensor([5, 5]), 50)
    b = uniform_noise(torch.tensor([9, 1, 3]), torch.tensor([5, 5, 5]), 50)
    assert torch.equal(a[0], b[2]) and torch.equal(a[1], b[0])
    assert not torch.equal(a[0], uniform_noise(torch.tensor([3]), torch.tensor([6]), 50)[0])
    big = uniform_noise(torch.arange(1000), torch.zeros(1000, dtype=torch.int64), 100)
    assert 0 < big.min() and big.max() < 1 and abs(big.mean().item() - 0.5) < 0.01


def test_gumbel_argmax_draws_the_tokens_of_the_plain_recipe():
    """The pruned draw picks exactly argmax(log p + -log(-log(uniform_noise))) of the whole vocabulary: peaked rows
    (few candidates), flat rows (all of them), rows with -inf (filtered) tokens, several rows per hash block."""
    gen = torch.Generator().manual_seed(0)
    for vocab, batch, scale in [(49152, 6, 6.0), (1000, 40, 0.01), (33, 9, 3.0), (5, 300, 1.0)]:
        scores = (torch.randn(batch, vocab, generator=gen) * scale).log_softmax(-1)
        scores[::3, vocab // 2:] = float("-inf")
        seeds, steps = torch.randint(0, 1 << 40, (batch,), generator=gen), torch.randint(0, 99, (batch,), generator=gen)
        plain = (scores + -torch.log(-torch.log(uniform_noise(seeds, steps, vocab))).float()).argmax(-1)
        assert torch.equal(gumbel_argmax(scores, seeds, steps), plain), (vocab, batch)
        assert not torch.equal(plain, scores.argmax(-1))  # the noise matters in these rows
