"""Sampling on fixed logits: the distribution drawn, filtering, and reproducibility per row."""

import torch

from rlinf_like.workers.rollout.engines.sampling import BLOCK, RowParams, inverse_cdf, sample, uniform


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
    a = uniform(torch.tensor([3, 9]), torch.tensor([5, 5]))
    b = uniform(torch.tensor([9, 1, 3]), torch.tensor([5, 5, 5]))
    assert a[0] == b[2] and a[1] == b[0]
    assert a[0] != uniform(torch.tensor([3]), torch.tensor([6]))[0]
    big = uniform(torch.arange(100_000), torch.zeros(100_000, dtype=torch.int64))
    assert 0 < big.min() and big.max() < 1 and abs(big.mean().item() - 0.5) < 0.005
    assert big.unique().numel() == big.numel()  # 53 bits: no collisions among 1e5 draws


def test_inverse_cdf_picks_the_first_index_past_u_of_the_total():
    """The two-level search equals the plain one (a float64 running sum over the whole row): vocabularies a block
    divides and ones it does not, flat and peaked rows, zero weights (filtered tokens) that are never picked."""
    gen = torch.Generator().manual_seed(0)
    for vocab, batch, scale in [(49152, 6, 6.0), (3 * BLOCK + 17, 40, 0.5), (33, 9, 3.0), (5, 300, 1.0)]:
        weights = (torch.randn(batch, vocab, generator=gen) * scale).softmax(-1)
        weights[::3, vocab // 2:] = 0
        u = torch.rand(batch, generator=gen, dtype=torch.float64)
        u[0] = 1 - 2.0**-53  # the last positive token, past the zero tail
        running = weights.double().cumsum(-1)
        plain = torch.searchsorted(running, (u * running[:, -1])[:, None], right=True)[:, 0]
        plain = plain.minimum(torch.where(weights > 0, torch.arange(vocab), -1).amax(-1))
        drawn = inverse_cdf(weights, u)
        assert torch.equal(drawn, plain), (vocab, batch)
        assert bool((weights.gather(1, drawn[:, None]) > 0).all())
        assert drawn[0] == plain[0] and weights[0, drawn[0]] > 0


def test_sampling_reads_the_vocabulary_in_float_only():
    """No integer tensor the size of the vocabulary (the per-token hash that once cost more than the model)."""
    logits = torch.randn(4, 4 * BLOCK)
    seen = []

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, tuple) else (out,):
                if isinstance(t, torch.Tensor) and not t.is_floating_point() and t.numel() >= logits.numel():
                    seen.append(func)
            return out

    with Watch():
        sample(logits, rows(4))
    assert not seen, seen


def test_rows_sampled_a_block_at_a_time_draw_the_same_tokens_within_a_bounded_workspace(monkeypatch):
    """A 262k vocabulary at 128 rows would keep two 134 MB buffers: rows go through in blocks, each row's draw and
    logprob unchanged (they depend on the row alone)."""
    from rlinf_like.workers.rollout.engines import sampling

    logits = torch.randn(40, 4096, generator=torch.Generator().manual_seed(0)) * 3
    params = rows(40, temperature=0.8, top_k=50, seeds=torch.arange(40) * 7, step=3)
    params.temperature[::5] = 0.0
    whole = sampling.sample(logits, params, sampling.Workspace())
    monkeypatch.setattr(sampling, "WORKSPACE_BYTES", 8 * 4 * 4096)  # 8 rows a block
    workspace = sampling.Workspace()
    blocks = sampling.sample(logits, params, workspace)
    assert torch.equal(whole[0], blocks[0]) and torch.equal(whole[1], blocks[1])
    assert workspace._buffers[0].shape == (8, 4096)
