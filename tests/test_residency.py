"""Offload / onload in place: storages freed, bit-exact round trips, identical training."""

import copy
import resource

import pytest
import torch
from torch import nn

from rlinf_like.hybrid_engines import PARTS, ResidencyManager


class TinyLM(nn.Module):
    """Tied embedding / output weights, a buffer and a norm: the cases that share or own storage."""

    def __init__(self, vocab=32, dim=16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one storage
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, tokens):
        h = self.embed(tokens)
        return self.head(self.norm(h + self.scale * self.mlp(h)))


def make(seed=0):
    torch.manual_seed(seed)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train_step(model, opt, step):
    g = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, 32, (4, 8), generator=g)
    logits = model(tokens[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 32), tokens[:, 1:].reshape(-1))
    opt.zero_grad(set_to_none=False)
    loss.backward()
    opt.step()
    return loss.item()


def snapshot(model, opt):
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "optimizer": copy.deepcopy(opt.state_dict()["state"]),
    }


def assert_bit_exact(a, b):
    assert a["params"].keys() == b["params"].keys() and a["grads"].keys() == b["grads"].keys()
    for part in ("params", "grads"):
        for name in a[part]:
            assert torch.equal(a[part][name], b[part][name]), (part, name)
    for idx, state in a["optimizer"].items():
        for key, value in state.items():
            assert torch.equal(value, b["optimizer"][idx][key]), (idx, key)


def test_offload_frees_every_storage_and_onload_is_bit_exact():
    model, opt = make()
    train_step(model, opt, 0)
    before = snapshot(model, opt)
    params = list(model.parameters())
    grads = [p.grad for p in params]
    exp_avg = [opt.state[p]["exp_avg"] for p in params]
    res = ResidencyManager(model, opt)
    sizes = {part: res.device_bytes(part) for part in PARTS}
    assert all(sizes.values())

    stats = res.offload()
    assert [s.part for s in stats] == list(PARTS)
    assert {part: res.device_bytes(part) for part in PARTS} == {p: 0 for p in PARTS}
    assert all(p.untyped_storage().nbytes() == 0 for p in params)
    assert [s.bytes for s in stats] == [sizes[p] for p in PARTS]
    # The tied weight is one storage: moved once, counted once.
    n_param_bytes = sum(p.numel() * 4 for p in params) + 4  # + the buffer
    assert sizes["params"] == n_param_bytes

    res.onload()
    assert_bit_exact(before, snapshot(model, opt))
    # Same objects everywhere: the optimizer and the model still reference them.
    assert all(a is b for a, b in zip(params, model.parameters()))
    assert all(a is p.grad for a, p in zip(grads, params))
    assert all(a is opt.state[p]["exp_avg"] for a, p in zip(exp_avg, params))
    assert model.head.weight is model.embed.weight


def test_training_after_round_trips_equals_training_without():
    ref_model, ref_opt = make()
    model, opt = make()
    res = ResidencyManager(model, opt)
    ref_losses, losses = [], []
    for step in range(6):
        ref_losses.append(train_step(ref_model, ref_opt, step))
        losses.append(train_step(model, opt, step))
        res.offload()
        res.onload(["optimizer", "params"])  # any order, any subset
        res.onload("grads")
    assert losses == ref_losses  # exact float equality, not a tolerance
    assert_bit_exact(snapshot(ref_model, ref_opt), snapshot(model, opt))


def test_parts_move_independently():
    model, opt = make()
    train_step(model, opt, 0)
    res = ResidencyManager(model, opt)
    res.offload(["optimizer"])
    assert res.is_offloaded("optimizer") and not res.is_offloaded("params")
    assert res.device_bytes("optimizer") == 0 and res.device_bytes("params") > 0
    assert res.offload(["optimizer"])[0].bytes == 0  # already off: nothing moves
    res.onload(["optimizer"])
    assert res.device_bytes("optimizer") > 0


def test_host_buffers_are_reused_across_round_trips():
    model, opt = make()
    train_step(model, opt, 0)
    res = ResidencyManager(model, opt)
    res.offload()
    host_bytes = res.host_bytes()
    ptrs = sorted(s.host.data_ptr() for part in res._parts.values() for s in part.slots.values())
    res.onload()
    train_step(model, opt, 1)
    res.offload()
    assert res.host_bytes() == host_bytes
    assert sorted(s.host.data_ptr() for part in res._parts.values() for s in part.slots.values()) == ptrs
    res.onload()


def test_cpu_onload_reuses_the_freed_blocks_and_is_bit_exact():
    """On CPU the freed blocks are kept: onload gets the same memory back (no fresh pages to fault in)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 512))  # 2 MiB weights: mmap-sized blocks
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 512)).sum().backward()
    opt.step()
    before = snapshot(model, opt)
    res = ResidencyManager(model, opt)
    ptrs = [p.untyped_storage().data_ptr() for p in model.parameters()]
    for _ in range(3):
        moved = sum(s.bytes for s in res.offload())
        assert all(res.device_bytes(p) == 0 for p in PARTS)
        assert res.cached_bytes() == moved  # every freed byte kept for the next onload
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        res.onload()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        assert faults < moved // 4096 // 10, faults  # a fresh allocation faults in every 4 KiB page
        assert [p.untyped_storage().data_ptr() for p in model.parameters()] == ptrs
        assert res.cached_bytes() == 0
        assert_bit_exact(before, snapshot(model, opt))
    res.offload()
    assert res.release_cache() == moved and res.cached_bytes() == 0
    res.onload()  # allocates afresh
    assert_bit_exact(before, snapshot(model, opt))


def test_unknown_part_is_named():
    model, opt = make()
    with pytest.raises(ValueError, match="'gradients'.*allowed: \\['params', 'grads', 'optimizer'\\]"):
        ResidencyManager(model, opt).offload(["gradients"])


@pytest.mark.gpu
def test_gpu_memory_actually_drops_and_comes_back():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(8, 1024, device="cuda")).sum().backward()
    opt.step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    res = ResidencyManager(model, opt)
    moved = sum(s.bytes for s in res.offload())
    assert torch.cuda.memory_allocated() <= before - moved + 1024
    slots = [s for part in res._parts.values() for s in part.slots.values()]
    # AdamW keeps its `step` counters on the host: only the GPU storages go through pinned buffers
    on_gpu = [s for s in slots if s.storage.device.type == "cuda"]
    assert len(on_gpu) == 16 and all(s.host.is_pinned() for s in on_gpu)
    res.onload()
    assert torch.cuda.memory_allocated() == before


def test_a_model_loaded_from_safetensors_offloads(tmp_path):
    """from_pretrained maps the checkpoint file: its storages cannot be resized until the manager copies them."""
    from transformers import AutoModelForCausalLM

    from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

    model = AutoModelForCausalLM.from_pretrained(write_tiny_model(tmp_path / "m", TinyModelSpec(seed=1)),
                                                 dtype=torch.float32)
    assert not all(p.untyped_storage().resizable() for p in model.parameters())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    manager = ResidencyManager(model)
    manager.offload(["params"])
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())
    manager.onload(["params"])
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight or not model.config.tie_word_embeddings
