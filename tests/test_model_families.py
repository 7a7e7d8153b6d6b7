"""One model-family description read by every backend: the native rollout engine's layouts, the
Megatron conversion rules and the Megatron shard layouts split each weight the way its family says."""

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
from greedy_contract import TINY_TIE_NATS, assert_greedy_contract
from transformers import AutoModelForCausalLM

from rlinf_like.hybrid_engines.megatron import convert, layouts
from rlinf_like.hybrid_engines.megatron.model import model_config as megatron_config
from rlinf_like.models import load_tokenizer
from rlinf_like.models.families import MODEL_FAMILIES, FamilyRegistry, ModelConfig, base
from rlinf_like.models.families.llama import LLAMA
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native import model as native

TINY = dict(hidden_size=48, intermediate_size=72, num_layers=2, num_heads=6, num_kv_heads=2)
# Llama-3.x's scaling with a short original context, so that it moves most of a 16-wide head's frequencies
LLAMA3_ROPE = (4.0, 1.0, 4.0, 16)


def hf_config(arch: str, **overrides) -> dict:
    model, _ = build_tiny_model(TinyModelSpec(arch=arch, **TINY, head_dim=12 if arch == "qwen3" else None))
    return {**model.config.to_dict(), **overrides}


def split_dims(layouts_) -> dict[str, int | None]:
    """The dimension along which each tensor's rank boxes differ (None: every rank holds the same box)."""
    out = {}
    for layout in layouts_:
        differ = [d for d in range(len(layout.shape)) if len({box[d] for box in layout.boxes}) > 1]
        assert len(differ) <= 1, layout
        out[layout.name] = differ[0] if differ else None
    return out


# the families Megatron converts or lays out like dense decoders (the MoE families: tests/test_moe.py)
DENSE = [name for name in MODEL_FAMILIES.names() if MODEL_FAMILIES.get(name).moe is None]


@pytest.mark.parametrize("family", DENSE)
def test_native_engine_and_megatron_split_every_weight_as_the_family_says(family):
    cfg = ModelConfig.from_hf(hf_config(family))
    assert cfg.family is MODEL_FAMILIES.get(family)
    native_layouts = native.weight_layouts(cfg, 2, torch.float32)
    coords = [layouts.RankCoord(tp_rank=t, pp_rank=0) for t in range(2)]
    megatron_layouts = layouts.hf_layouts(cfg, convert.rules_for(cfg.family), coords, 2, 1, torch.float32)
    native_dims, megatron_dims = split_dims(native_layouts), split_dims(megatron_layouts)
    assert native_dims.keys() == megatron_dims.keys() == {name for name, _ in cfg.named_weights()}
    assert {l.name: l.shape for l in native_layouts} == {l.name: l.shape for l in megatron_layouts}
    for name, weight in cfg.named_weights():
        assert megatron_dims[name] == weight.tp_dim, name
        assert native_dims[name] == weight.tp_dim, name  # vocabulary-parallel weights too (split by rows)
    split = {name for name, dim in megatron_dims.items() if dim is not None}
    assert any(".o_proj." in n for n in split) and "model.embed_tokens.weight" in split


@pytest.mark.parametrize("family", DENSE)
def test_megatron_rules_and_native_fusion_are_the_family_s_groups(family):
    cfg = ModelConfig.from_hf(hf_config(family))
    rules = convert.rules_for(cfg.family)
    for name, weight in cfg.named_weights():
        [rule] = [r for r in rules if weight.hf in r.hf]
        assert (rule.megatron, rule.fuse, rule.tp_dim) == (weight.megatron, weight.fuse, weight.tp_dim)
    assert [r.hf for r in rules if r.fuse == "gate_up"] == [("model.layers.{i}.mlp.gate_proj.weight",
                                                             "model.layers.{i}.mlp.up_proj.weight")]
    weights = {name: torch.randn(cfg.shape(w)) for name, w in cfg.named_weights()}
    fused = native.fuse_projections(cfg, weights)
    qkv = fused["model.layers.1.self_attn.qkv.weight"]
    assert qkv.shape[0] == cfg.q_size + 2 * cfg.kv_size
    assert fused["model.layers.1.self_attn.k_proj.weight"].data_ptr() == qkv[cfg.q_size:].data_ptr()
    assert ("model.layers.0.self_attn.qkv.bias" in fused) == cfg.attention_bias


def test_bias_and_tied_embedding_rules():
    assert ModelConfig.from_hf(hf_config("qwen2")).attention_bias  # always, whatever config.json says
    assert not ModelConfig.from_hf(hf_config("llama")).attention_bias
    llama_bias = ModelConfig.from_hf(hf_config("llama", attention_bias=True))
    assert "model.layers.0.self_attn.q_proj.bias" in dict(llama_bias.named_weights())
    tied = ModelConfig.from_hf(hf_config("llama", tie_word_embeddings=True))
    assert "lm_head.weight" not in dict(tied.named_weights())
    assert LLAMA.tied == ("lm_head.weight", "model.embed_tokens.weight")


def test_unknown_model_types_and_families_are_refused_naming_the_supported_ones(tmp_path):
    gpt2 = {"model_type": "gpt2"}
    (tmp_path / "config.json").write_text(json.dumps(gpt2))
    with pytest.raises(ValueError, match=r"native engine: model_type 'gpt2' is not supported; supported: "
                                         r"\['llama', 'qwen2', 'qwen3', 'gemma3_text', 'qwen3_moe', 'mixtral'\] "
                                         r"\(use rollout.engine=hf or "
                                         r"sglang\)"):
        native.model_config(tmp_path)
    with pytest.raises(ValueError, match=r"megatron manager: model_type 'gpt2' is not supported; supported: "
                                         r"\['llama', 'qwen2', 'qwen3', 'gemma3_text', 'qwen3_moe', 'mixtral'\]"):
        megatron_config(gpt2)
    with pytest.raises(KeyError, match=r"model family 'gpt2' is not registered; "
                                       r"supported: \['llama', 'qwen2', 'qwen3', 'gemma3', 'qwen3_moe', 'mixtral'\]"):
        MODEL_FAMILIES.get("gpt2")
    with pytest.raises(ValueError, match=r"rope type 'linear'"):
        ModelConfig.from_hf(hf_config("llama", rope_parameters={"rope_type": "linear", "factor": 2.0}))


def test_a_new_family_is_one_registration_every_backend_then_serves(monkeypatch):
    registry = FamilyRegistry()
    for family in MODEL_FAMILIES.names():
        registry.register(MODEL_FAMILIES.get(family))
    with pytest.raises(ValueError, match=r"model_type 'llama' is already served by 'llama'"):
        registry.register(replace(LLAMA, name="llama-again"))
    registry.register(replace(LLAMA, name="mistral", model_types=("mistral",)))
    monkeypatch.setattr(base, "MODEL_FAMILIES", registry)
    cfg = ModelConfig.from_hf(hf_config("llama", model_type="mistral"))
    assert cfg.family.name == "mistral"
    assert split_dims(native.weight_layouts(cfg, 2, torch.float32))["model.layers.0.mlp.down_proj.weight"] == 1
    assert {r.megatron for r in convert.rules_for(cfg.family)} == {r.megatron for r in convert.rules_for(LLAMA)}


# Each family as transformers runs it, tied and untied: a tiny random model (hidden 64, 2 layers, GQA)
VARIANTS = {
    "llama": TinyModelSpec(arch="llama"),
    "llama-tied": TinyModelSpec(arch="llama", tie_word_embeddings=True),
    "llama-llama3-rope": TinyModelSpec(arch="llama", llama3_rope=LLAMA3_ROPE),
    "qwen2": TinyModelSpec(arch="qwen2"),
    "qwen2-tied": TinyModelSpec(arch="qwen2", tie_word_embeddings=True),
    "qwen3": TinyModelSpec(arch="qwen3", head_dim=24),  # head_dim != hidden / heads (16)
    "qwen3-tied": TinyModelSpec(arch="qwen3", head_dim=24, tie_word_embeddings=True),
    # q/k/v and o_proj biases (transformers' attention_bias), random: an o_proj bias dropped changes every token
    "llama-attention-bias": TinyModelSpec(arch="llama", attention_bias=True),
    # sliding window 8: the 19-token prompt passes it in prefill, every prompt in decode (tiny.GEMMA3_TEXT)
    "gemma3": TinyModelSpec(arch="gemma3"),
    "gemma3-tied": TinyModelSpec(arch="gemma3", tie_word_embeddings=True),
}
FAMILY_PROMPTS = ["12+34=", "The quick brown fox", "x"]


# every variant in float32; one per family in bfloat16 (the contract's other half, tests/greedy_contract.py)
GREEDY_CASES = [(v, "float32") for v in VARIANTS] + [(v, "bfloat16") for v in ("llama", "qwen2", "qwen3", "gemma3")]


@pytest.mark.parametrize("variant,dtype", GREEDY_CASES)
def test_native_engine_greedy_tokens_and_logprobs_equal_transformers_for_each_family(variant, dtype, tmp_path):
    spec = VARIANTS[variant]
    path = str(write_tiny_model(tmp_path, spec))
    cfg = native.model_config(path)
    assert cfg.family.name == spec.arch and cfg.tie_word_embeddings == spec.tie_word_embeddings
    assert (cfg.rope_scaling is not None) == (spec.llama3_rope is not None)
    assert cfg.head_dim == (spec.head_dim or spec.hidden_size // spec.num_heads)
    tok = load_tokenizer(path)
    params = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)
    reqs = [RolloutRequest(f"r{i}", tok(p).input_ids, params, 1) for i, p in enumerate(FAMILY_PROMPTS)]
    ours = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=4, dtype=dtype)).generate(reqs)
    reference = make_engine(RolloutConfig(engine="hf", model_path=path, dtype=dtype)).generate(reqs)
    assert all(len(b.response_ids[0]) == 12 for b in reference)
    fp32_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) if dtype != "float32" else None
    agreed = assert_greedy_contract(ours, reference, dtype, fp32_model, TINY_TIE_NATS)
    assert max(agreed) >= 4, agreed  # a broken decoder differs at once, and not at near ties


def test_llama3_rope_and_qk_norm_are_read_from_config_json():
    scaled = ModelConfig.from_hf(hf_config("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}))
    assert scaled.rope_theta == 500000.0 and scaled.rope_scaling.factor == 32.0
    assert native.rope_inv_freq(scaled)[-1] < native.rope_inv_freq(replace(scaled, rope_scaling=None))[-1] / 31
    with pytest.raises(ValueError, match=r"rope type 'llama3' needs 'factor'"):
        ModelConfig.from_hf(hf_config("llama", rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}))
    qwen3 = ModelConfig.from_hf(hf_config("qwen3"))
    assert qwen3.qk_norm and qwen3.head_dim == 12 and not qwen3.attention_bias
    assert dict(qwen3.named_weights())["model.layers.1.self_attn.k_norm.weight"].parallel == "replicated"
    assert qwen3.shape(qwen3.family.weight("model.layers.{i}.self_attn.q_norm.weight")) == (12,)
    with pytest.raises(ValueError, match=r"sliding-window attention"):
        ModelConfig.from_hf(hf_config("qwen3", use_sliding_window=True))


def test_gemma3_config_reads_its_window_rope_bases_and_scale_and_refuses_what_it_does_not_implement():
    gemma = ModelConfig.from_hf(hf_config("gemma3"))
    assert gemma.family.name == "gemma3" and gemma.sliding_window == 8 and gemma.layer_types == (
        "sliding_attention", "full_attention")
    assert (gemma.rope_theta, gemma.sliding_rope_theta, gemma.attn_scale) == (1e6, 1e4, 24 ** -0.5)
    assert gemma.is_sliding(0) and not gemma.is_sliding(1)
    assert native.rope_inv_freq(gemma, sliding=True)[1] > native.rope_inv_freq(gemma)[1]  # the smaller base
    # transformers 4's keys: rope_theta / rope_local_base_freq and a pattern instead of layer_types
    old = hf_config("gemma3", layer_types=None, rope_parameters=None, rope_theta=1e6, rope_local_base_freq=1e4,
                    sliding_window_pattern=2)
    assert ModelConfig.from_hf(old).layer_types == gemma.layer_types
    assert ModelConfig.from_hf(old).sliding_rope_theta == 1e4
    for key, value in (("final_logit_softcapping", 30.0), ("attn_logit_softcapping", 50.0),
                       ("hidden_activation", "gelu"), ("use_bidirectional_attention", True)):
        with pytest.raises(ValueError, match=rf"{key}={value!r} is not supported by the 'gemma3' family"):
            ModelConfig.from_hf(hf_config("gemma3", **{key: value}))
    with pytest.raises(ValueError, match=r"mlp_bias=True is not supported by the 'llama' family \(supported: "
                                         r"\[False\]\)"):
        ModelConfig.from_hf(hf_config("llama", mlp_bias=True))
    with pytest.raises(ValueError, match=r"layer_types has sliding_attention layers, which the 'llama' family"):
        ModelConfig.from_hf(hf_config("llama", layer_types=["sliding_attention", "full_attention"],
                                      sliding_window=8))
    with pytest.raises(ValueError, match=r"megatron manager: model_type 'gemma3_text' \(the 'gemma3' family\) is "
                                         r"not supported: megatron-core's GPT layer spec has no norm after"):
        megatron_config(hf_config("gemma3"))
    with pytest.raises(ValueError, match=r"megatron manager: attention_bias=true with an o_proj bias"):
        megatron_config(hf_config("llama", attention_bias=True))
    assert not ModelConfig.from_hf(hf_config("qwen2", attention_bias=True)).o_bias  # Qwen2 has none, ever


def _add_tensor(path, name, shape):
    from safetensors.torch import load_file, save_file

    weights = load_file(path / "model.safetensors")
    weights[name] = torch.zeros(shape)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_every_checkpoint_tensor_is_used_or_refused_by_name_before_any_worker_starts(tmp_path):
    from rlinf_like.runners.reasoning.checks import check_model
    from rlinf_like.runners.reasoning.config import ModelSection
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    def run(path, engine="native"):
        return replace(ReasoningConfig(model=ModelSection(path=str(path))), rollout=replace(
            ReasoningConfig().rollout, engine=engine))

    # every optional tensor the llama family declares: q/k/v/o biases and an untied head
    full = write_tiny_model(tmp_path / "full", TinyModelSpec(arch="llama", attention_bias=True))
    cfg = native.model_config(full)
    names = {n for n, _ in cfg.named_weights()}
    assert {"model.layers.1.self_attn.o_proj.bias", "model.layers.1.self_attn.v_proj.bias",
            "lm_head.weight"} <= names
    engine = make_engine(RolloutConfig(engine="native", model_path=str(full), max_batch_size=2, dtype="float32"))
    assert names <= set(engine.weights)  # every tensor loaded, none dropped
    check_model(run(full))  # accepted

    extra = write_tiny_model(tmp_path / "extra", TinyModelSpec(arch="llama", attention_bias=True))
    _add_tensor(extra, "model.layers.0.mlp.down_proj.bias", (64,))
    with pytest.raises(ValueError, match=r"does not map for this config.json: \['model.layers.0.mlp.down_proj.bias'\]"):
        make_engine(RolloutConfig(engine="native", model_path=str(extra), max_batch_size=2, dtype="float32"))
    with pytest.raises(ValueError, match=r"model.path=.*: the checkpoint has tensors the 'llama' family does not "
                                         r"map for this config.json: \['model.layers.0.mlp.down_proj.bias'\]"):
        check_model(run(extra))
    # biases in the checkpoint, attention_bias missing from config.json: refused, not silently dropped
    undeclared = tmp_path / "undeclared"
    undeclared.mkdir()
    for f in full.iterdir():
        (undeclared / f.name).write_bytes(f.read_bytes())
    config = json.loads((undeclared / "config.json").read_text())
    (undeclared / "config.json").write_text(json.dumps({**config, "attention_bias": False}))
    with pytest.raises(ValueError, match=r"'model.layers.0.self_attn.k_proj.bias', "
                                         r"'model.layers.0.self_attn.o_proj.bias'"):
        check_model(run(undeclared, engine="hf"))


# One process, world size 1 over gloo: megatron's GPTModel from each family's HF weights, logprobs vs HF
MEGATRON_VS_HF = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
from rlinf_like.hybrid_engines.megatron import MegatronConfig, MegatronModelManager
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model
specs = {"qwen3": TinyModelSpec(arch="qwen3", head_dim=24, init_std=0.05),
         "qwen3-tied": TinyModelSpec(arch="qwen3", tie_word_embeddings=True, init_std=0.05),
         # megatron fixes low 1 / high 4 / original 8192: long rows reach the low frequencies it scales
         "llama-llama3-rope": TinyModelSpec(arch="llama", llama3_rope=(8.0, 1.0, 4.0, 8192), init_std=0.05,
                                            max_position_embeddings=16384)}
ids = torch.randint(4, 90, (2, 120), generator=torch.Generator().manual_seed(0))
for name, spec in specs.items():
    model, _ = build_tiny_model(spec)
    manager = MegatronModelManager(model, MegatronConfig())
    ours = manager.compute_logprobs({"input_ids": ids, "attention_mask": torch.ones_like(ids)})
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=ids).logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    print(name, float((ours - ref).abs().max()))
    manager.close()
"""


@pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="needs megatron-core")
def test_megatron_model_of_each_new_family_gives_transformers_logprobs():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", MEGATRON_VS_HF], capture_output=True, text=True, env=env, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    errors = dict(line.split() for line in out.stdout.splitlines())
    assert errors.keys() == {"qwen3", "qwen3-tied", "llama-llama3-rope"}
    assert all(float(e) < 1e-4 for e in errors.values()), errors


def test_megatron_refuses_llama3_rope_parameters_it_cannot_express():
    from rlinf_like.hybrid_engines.megatron.model import rope_kwargs

    ok = ModelConfig.from_hf(hf_config("llama", rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}))
    assert rope_kwargs(ok) == {"rope_scaling": True, "rope_scaling_factor": 32.0}
    with pytest.raises(ValueError, match=r"megatron manager: llama3 rope scaling .* use actor.backend=fsdp"):
        rope_kwargs(replace(ok, rope_scaling=replace(ok.rope_scaling, original_max_position_embeddings=16)))
