"""CPU bf16 training runs short sequences' attention in float32 (hybrid_engines/cpu_attention.py): exactly the
float32 kernel's result on the bf16 inputs, and nothing changes for inference, long sequences or float32 inputs."""

import pytest
import torch
import torch.nn.functional as F

from rlinf_like.hybrid_engines import cpu_attention


@pytest.fixture
def wrapped():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return cpu_attention._wrap(sdpa_attention_forward), sdpa_attention_forward


def qkv(length: int, dtype=torch.bfloat16, grad=True):
    g = torch.Generator().manual_seed(length)
    shapes = [(2, 4, length, 16), (2, 2, length, 16), (2, 2, length, 16)]  # grouped-query: 4 query, 2 key/value heads
    return [torch.randn(s, generator=g).to(dtype).requires_grad_(grad) for s in shapes]


class Attention(torch.nn.Module):  # what transformers' sdpa_attention_forward reads from the module
    num_key_value_groups = 2
    is_causal = True


def test_a_short_training_forward_attends_in_float32_and_gives_its_gradients(wrapped):
    forward, plain = wrapped
    q, k, v = qkv(24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = forward(Attention(), q, k, v, None)
    assert out.dtype == torch.bfloat16
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=True, enable_gqa=True).transpose(1, 2)
    assert torch.equal(out, ref.to(torch.bfloat16))  # the float32 kernel, rounded once at the end
    bf16, _ = plain(Attention(), q, k, v, None)
    assert not torch.equal(out, bf16)  # not the bf16 kernel: the routing is real
    out.float().sum().backward()
    ref.to(torch.bfloat16).float().sum().backward()
    for a, b in zip((q, k, v), (q32, k32, v32)):
        assert a.grad.dtype == torch.bfloat16 and torch.equal(a.grad, b.grad.to(torch.bfloat16))


@pytest.mark.parametrize("case", ["inference", "long", "float32"])
def test_everything_else_is_transformers_sdpa_bit_for_bit(wrapped, case):
    forward, plain = wrapped
    length = cpu_attention.FP32_BELOW if case == "long" else 24
    q, k, v = qkv(length, torch.float32 if case == "float32" else torch.bfloat16, grad=case != "inference")
    with torch.no_grad() if case == "inference" else torch.enable_grad():
        assert torch.equal(forward(Attention(), q, k, v, None)[0], plain(Attention(), q, k, v, None)[0])


def test_install_routes_transformers_sdpa_once():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    cpu_attention.install()
    cpu_attention.install()
    routed = ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert hasattr(routed, "wrapped") and not hasattr(routed.wrapped, "wrapped")
