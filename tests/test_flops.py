"""The FLOP count behind MFU (utils/flops.py) against torch's own count of a transformers model's matrix products,
and the cached matmul peak (utils/peak.py)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from rlinf_like.utils.flops import ModelShape, rollout_flops, shared_forward, train_flops
from rlinf_like.utils.peak import matmul_peak

CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=24,
              intermediate_size=96, vocab_size=300, tie_word_embeddings=False)


def counted(model, ids, backward=False) -> dict[str, int]:
    """torch's FLOPs of the forward (and backward), split into attention (eager attention's batched products; torch
    counts no FLOPs for the CPU's fused SDPA kernel) and the rest (the linear layers' products)."""
    with FlopCounterMode(display=False) as counter:
        logits = model(ids).logits
        if backward:
            logits.float().pow(2).mean().backward()
    split = {"attention": 0, "matmul": 0}
    for op, flops in counter.get_flop_counts()["Global"].items():
        split["attention" if "bmm" in str(op) else "matmul"] += flops
    return split


@pytest.fixture(scope="module")
def model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CONFIG, attn_implementation="eager")).float()


def test_the_count_is_torchs_count_of_the_same_forward_and_backward(model):
    shape = ModelShape.from_hf_config({**CONFIG, "model_type": "llama"})
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.body_params + shape.head_params == linear  # every projection and MLP weight, and the output layer

    tokens = 10
    ids = torch.randint(0, CONFIG["vocab_size"], (1, tokens))
    fwd = counted(model, ids)
    no_attention = shape.forward(tokens, head_positions=tokens) - 4.0 * shape.layers * shape.heads * \
        shape.head_dim * tokens * (tokens + 1) / 2
    assert fwd["matmul"] == no_attention
    # torch counts every (query, key) pair of the score matrix; a causal layer uses T(T+1)/2 of the T^2
    assert fwd["attention"] * (tokens + 1) / (2 * tokens) == pytest.approx(
        shape.forward(tokens, head_positions=tokens) - no_attention)

    both = counted(model, ids, backward=True)
    assert both["matmul"] == 3 * fwd["matmul"]  # a backward is twice its forward ...
    assert train_flops(shape, [(0, tokens)], updates=1) == pytest.approx(
        3 * shape.forward(tokens, head_positions=tokens))
    for p in model.parameters():  # ... and once with the weights frozen (LoRA's base): input gradients only
        p.requires_grad_(False)
    model.model.embed_tokens.weight.requires_grad_(True)  # something upstream needs gradients
    frozen = counted(model, ids, backward=True)
    for p in model.parameters():
        p.requires_grad_(True)
    # the first layer's input projections still pass a gradient back to the embedding; only weight gradients go
    assert frozen["matmul"] == 2 * fwd["matmul"]
    assert train_flops(shape, [(0, tokens)], frozen_base=True) == pytest.approx(
        2 * shape.forward(tokens, head_positions=tokens))


def test_the_rollouts_count_is_its_prefill_and_one_forward_per_decoded_token():
    shape = ModelShape.from_hf_config(CONFIG)
    prompt, responses = 7, [5, 1, 3]
    decode = sum(shape.forward(1, head_positions=1, context=prompt + j) for r in responses for j in range(r - 1))
    prefill = shape.forward(prompt, head_positions=1)
    assert rollout_flops(shape, [(prompt, responses)], shared_prompt=True) == pytest.approx(prefill + decode)
    assert rollout_flops(shape, [(prompt, responses)], shared_prompt=False) == pytest.approx(3 * prefill + decode)


def test_the_peak_is_measured_once_per_machine_and_precision(tmp_path, monkeypatch):
    monkeypatch.setenv("RLINF_CACHE_DIR", str(tmp_path))
    # small shapes: the cache is what is checked, and bf16 without bf16 units (AVX2) runs ~0.35 GFLOP/s
    monkeypatch.setattr("rlinf_like.utils.peak.CPU_SHAPES", ((256, 256, 256),))
    first = matmul_peak("fp32")
    again = matmul_peak("fp32")
    assert not first.cached and again.cached and again.flops_per_s == first.flops_per_s > 1e8
    assert "1 thread(s)" in first.where and "fp32" in first.describe()
    assert not matmul_peak("bf16").cached  # another precision is another measurement
    assert (tmp_path / "matmul_peak.json").exists()


def test_a_peak_read_while_the_core_was_shared_is_probed_again_and_the_best_reading_kept(tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("RLINF_CACHE_DIR", str(tmp_path))
    readings = iter([(50e9, False), (120e9, True), (90e9, True)])  # (FLOP/s, whether the probe had its core)
    monkeypatch.setattr("rlinf_like.utils.peak.measure", lambda *a, **k: next(readings))
    loaded = matmul_peak("fp32")
    assert loaded.flops_per_s == 50e9 and not loaded.quiet and "core was shared" in loaded.describe()
    assert matmul_peak("fp32").cached  # within REPROBE_S of the loaded reading: no new probe
    monkeypatch.setattr("rlinf_like.utils.peak.REPROBE_S", 0.0)
    quiet = matmul_peak("fp32")
    assert (quiet.flops_per_s, quiet.quiet, quiet.cached) == (120e9, True, False)
    settled = matmul_peak("fp32")  # one quiet reading settles it: no third probe
    assert (settled.flops_per_s, settled.cached) == (120e9, True)
    # a cache written before readings were marked holds a bare number: probed again, the best kept
    path = tmp_path / "matmul_peak.json"
    path.write_text(json.dumps({key: 68e9 for key in json.loads(path.read_text())}))
    assert (matmul_peak("fp32").flops_per_s, matmul_peak("fp32").quiet) == (90e9, True)


def test_the_probe_knows_when_another_process_shared_its_core(monkeypatch):
    import os
    import subprocess
    import sys
    import time

    from rlinf_like.utils.peak import measure

    monkeypatch.setattr("rlinf_like.utils.peak.CPU_SHAPES", ((256, 256, 256),))
    mine = os.sched_getaffinity(0)
    core = min(mine)
    busy = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
    os.sched_setaffinity(0, {core})  # this process and a spinning one on one core: each gets about half of it
    try:
        time.sleep(0.3)
        flops, quiet = measure("fp32", seconds=0.5)
    finally:
        busy.kill()
        busy.wait()
        os.sched_setaffinity(0, mine)
    assert flops > 0 and not quiet


def test_a_shared_prompt_is_counted_once_per_group():
    shape = ModelShape(layers=2, hidden=64, heads=4, head_dim=16, kv_heads=2, intermediate=128, vocab=100)
    prompt, responses = 36, [28, 20, 5, 28]
    rows = train_flops(shape, [(prompt, r) for r in responses], updates=0, forwards=1)
    shared = shared_forward(shape, [(prompt, responses)])
    # the rows' forward less the prompt's repeats: a response attending to the prompt costs what it does in a row
    assert shared == pytest.approx(rows - (len(responses) - 1) * shape.forward(prompt, head_positions=0))
    assert shared_forward(shape, [(prompt, [28])]) == pytest.approx(train_flops(shape, [(prompt, 28)], updates=0,
                                                                                forwards=1))
