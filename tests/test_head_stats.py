"""Logprobs and entropy without the [B, T, V] logits (hybrid_engines/head_stats.py): in fp32 the chunked path gives
the full pass's numbers bit for bit at the positions a loss reads, the same gradients, and the backward keeps no
vocabulary-sized tensor of the whole batch."""

import pytest
import torch

from rlinf_like.hybrid_engines import head_stats
from rlinf_like.hybrid_engines.model_manager import token_nll_loss, token_stats
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model

B, T = 48, 24
FULL = 1 << 50  # a chunk budget no batch reaches: one plain pass


@pytest.fixture(scope="module")
def model():
    model, _ = build_tiny_model(TinyModelSpec(seed=3))
    return model.train()


def _batch(vocab: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[::3, -5:] = 0  # right padding on a third of the rows
    ids[mask == 0] = 0
    response = torch.zeros(B, T - 1)
    response[:, 8:] = 1
    response *= mask[:, 1:]
    return {k: v.to(device) for k, v in dict(input_ids=ids, attention_mask=mask, response_mask=response).items()}


def _run(model, batch, chunk_bytes, entropy_grad=True):
    model.zero_grad(set_to_none=True)
    lp, ent = token_stats(model, batch, 0.9, entropy_grad=entropy_grad, chunk_bytes=chunk_bytes)
    mask = batch["response_mask"]
    ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
    return lp.detach() * mask, ent.detach() * mask, {n: p.grad.clone() for n, p in model.named_parameters()}


def test_chunked_logprobs_and_entropy_equal_the_full_pass_in_fp32_with_matching_gradients(model):
    batch = _batch(model.config.vocab_size)
    rows = head_stats.MIN_CHUNK_ROWS
    full = _run(model, batch, FULL)
    chunked = _run(model, batch, rows * model.config.vocab_size * 4)  # 64-row chunks: the 640 response rows in 10
    assert int(batch["response_mask"].sum()) >= 10 * rows
    assert torch.equal(full[0], chunked[0]) and torch.equal(full[1], chunked[1])
    # the head's gradient sums over chunks in another order: not bit for bit (on an Intel AMX host its elements
    # differed beyond 1e-5 relative), so each gradient is compared as a whole; a lost chunk would be ~10% off
    _same_gradients(full[2], chunked[2])


def _same_gradients(want: dict[str, torch.Tensor], got: dict[str, torch.Tensor], tol: float = 1e-4) -> None:
    assert want.keys() == got.keys()
    for name, grad in want.items():
        assert grad.norm() > 0, name
        assert (got[name] - grad).norm() <= tol * grad.norm(), (name, float((got[name] - grad).norm() / grad.norm()))


def test_the_backward_keeps_no_vocabulary_sized_tensor_of_the_whole_batch(model):
    batch = _batch(model.config.vocab_size)
    vocab = model.config.vocab_size
    saved: list[torch.Size] = []

    def pack(t):
        saved.append(t.shape)
        return t

    def vocabulary_rows(chunk_bytes):
        """The most positions any saved vocabulary-wide tensor covers."""
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            token_stats(model, batch, entropy_grad=True, chunk_bytes=chunk_bytes)
        return max((s.numel() // vocab for s in saved if s and s[-1] == vocab), default=0)

    assert vocabulary_rows(FULL) >= B * (T - 1)  # the full pass keeps the batch's logits
    assert vocabulary_rows(head_stats.MIN_CHUNK_ROWS * vocab * 4) <= head_stats.MIN_CHUNK_ROWS


def test_sft_loss_and_a_packed_batch_take_the_chunked_path_with_the_same_numbers(model):
    batch = _batch(model.config.vocab_size)
    small = head_stats.MIN_CHUNK_ROWS * model.config.vocab_size * 4
    nll = {k: v for k, v in batch.items() if k != "response_mask"}
    with torch.no_grad():
        loss_full, _ = token_nll_loss(model, nll)
        original = token_stats.__defaults__
        token_stats.__defaults__ = (1.0, None, small)  # token_nll_loss calls with the default budget
        try:
            loss_chunked, _ = token_nll_loss(model, nll)
        finally:
            token_stats.__defaults__ = original
        assert torch.equal(loss_full, loss_chunked)
        packed = pack_batch(nll, None)
        lp_packed_full, _ = token_stats(model, packed, chunk_bytes=FULL)
        lp_packed, _ = token_stats(model, packed, chunk_bytes=small)
    torch.testing.assert_close(lp_packed, lp_packed_full, rtol=0, atol=1e-6)


def test_models_the_stand_in_cannot_serve_take_the_full_pass():
    plain = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    assert head_stats.output_head(plain) is None
    model, _ = build_tiny_model(TinyModelSpec())
    assert head_stats.output_head(model) is model.lm_head
    model.config.final_logit_softcapping = 30.0  # Gemma 2: a soft-cap after the head would apply to our output
    assert head_stats.output_head(model) is None


@pytest.mark.gpu
def test_chunked_stats_on_cuda_match_the_full_pass():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model, _ = build_tiny_model(TinyModelSpec(seed=3))
    model = model.cuda().train()
    batch = _batch(model.config.vocab_size, "cuda")
    full = _run(model, batch, FULL)
    chunked = _run(model, batch, head_stats.MIN_CHUNK_ROWS * model.config.vocab_size * 4)
    torch.testing.assert_close(chunked[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked[1], full[1], rtol=0, atol=1e-5)
    _same_gradients(full[2], chunked[2])


@pytest.mark.gpu
def test_under_fsdp2_bf16_on_cuda_the_chunked_step_trains_like_the_full_one(tmp_path):
    """The stand-in head inside FSDP2's root forward, with its mixed-precision policy: the root's parameters are
    unsharded there and the chunked path's gradient reaches them."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
    from rlinf_like.hybrid_engines.model_manager import OptimConfig

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.cuda.set_device(0)
        cfg = LlamaConfig(vocab_size=4096, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        results = {}
        for name, budget in (("full", FULL), ("chunked", head_stats.MIN_CHUNK_ROWS * cfg.vocab_size * 4)):
            torch.manual_seed(0)
            manager = FSDPModelManager(LlamaForCausalLM(cfg).float(), FSDPConfig(precision="bf16",
                                                                                  optim=OptimConfig(lr=1e-3)))
            assert manager.sharded and not manager.autocast

            def loss_fn(model, batch, budget=budget):
                lp, ent = token_stats(model, batch, entropy_grad=True, chunk_bytes=budget)
                mask = batch["response_mask"]
                return -(lp * mask).sum() / mask.sum() - 0.01 * (ent * mask).sum() / mask.sum(), {}

            batch = _batch(cfg.vocab_size)
            losses = [manager.forward_backward(batch, loss_fn)["loss"]]
            grad = manager.optim_step()["grad_norm"]
            losses.append(manager.forward_backward(batch, loss_fn)["loss"])
            results[name] = (losses, grad)
        full, chunked = results["full"], results["chunked"]
        assert chunked[0][1] < chunked[0][0]  # the step lowered the loss
        assert chunked[1] > 0 and abs(chunked[1] - full[1]) <= 0.02 * full[1]
        for a, b in zip(full[0], chunked[0]):
            assert abs(a - b) <= 0.02 * abs(a)
    finally:
        dist.destroy_process_group()
