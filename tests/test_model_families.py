"""One model-family description read by every backend: the native rollout engine's layouts, the
Megatron conversion rules and the Megatron shard layouts split each weight the way its family says."""

import json
from dataclasses import replace

import pytest
import torch

from rlinf_like.hybrid_engines.megatron import convert, layouts
from rlinf_like.hybrid_engines.megatron.model import model_config as megatron_config
from rlinf_like.models.families import MODEL_FAMILIES, FamilyRegistry, ModelConfig, base
from rlinf_like.models.families.llama import LLAMA
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model
from rlinf_like.workers.rollout.native import model as native

TINY = dict(hidden_size=48, intermediate_size=72, num_layers=2, num_heads=6, num_kv_heads=2)


def hf_config(arch: str, **overrides) -> dict:
    model, _ = build_tiny_model(TinyModelSpec(arch=arch, **TINY))
    return {**model.config.to_dict(), **overrides}


def split_dims(layouts_) -> dict[str, int | None]:
    """The dimension along which each tensor's rank boxes differ (None: every rank holds the same box)."""
    out = {}
    for layout in layouts_:
        differ = [d for d in range(len(layout.shape)) if len({box[d] for box in layout.boxes}) > 1]
        assert len(differ) <= 1, layout
        out[layout.name] = differ[0] if differ else None
    return out


@pytest.mark.parametrize("family", MODEL_FAMILIES.names())
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
        # the one place they differ, by design: the native engine keeps vocabulary-parallel weights whole
        assert native_dims[name] == (None if weight.parallel == "vocab" else weight.tp_dim), name
    split = {name for name, dim in megatron_dims.items() if dim is not None}
    assert any(".o_proj." in n for n in split) and "model.embed_tokens.weight" in split


@pytest.mark.parametrize("family", MODEL_FAMILIES.names())
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
                                         r"\['llama', 'qwen2'\] \(use rollout.engine=hf or sglang\)"):
        native.model_config(tmp_path)
    with pytest.raises(ValueError, match=r"megatron manager: model_type 'gpt2' is not supported; "
                                         r"supported: \['llama', 'qwen2'\]"):
        megatron_config(gpt2)
    with pytest.raises(KeyError, match=r"model family 'gpt2' is not registered; supported: \['llama', 'qwen2'\]"):
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
