"""HF <-> Megatron conversion table and HF-named shard layouts, in one process (no megatron import):
round trips are exact, and Megatron TP/PP shards reshard into any rollout TP layout exactly."""

import subprocess
import sys

import pytest
import torch

from rlinf_like.hybrid_engines.megatron import convert, layouts
from rlinf_like.hybrid_engines.megatron.model import check_parallel, model_config
from rlinf_like.hybrid_engines.reshard import apply_in_process, plan_reshard, sharded, replicated
from rlinf_like.models.families import MODEL_FAMILIES
from rlinf_like.models.tiny import TinyModelSpec, build_tiny_model
from rlinf_like.utils.extras import MissingExtraError

# Qwen2 (q/k/v biases) with 6 heads over 2 key/value heads: TP=2 holds one group of 3 heads per rank.
SPECS = {"qwen2": TinyModelSpec(arch="qwen2", hidden_size=48, intermediate_size=72, num_layers=4, num_heads=6,
                                num_kv_heads=2),
         "llama-tied": TinyModelSpec(arch="llama", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                     num_kv_heads=2, tie_word_embeddings=True),
         # q/k norms (replicated over TP) and head_dim 12 != hidden / heads
         "qwen3": TinyModelSpec(arch="qwen3", hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                                num_kv_heads=2, head_dim=12)}


def hf_model(arch):
    model, _ = build_tiny_model(SPECS[arch])
    return model_config(model.config.to_dict()), {k: v.detach().clone() for k, v in model.state_dict().items()}


def megatron_names(cfg, pp_rank, pp):
    """The parameter names a pipeline stage of megatron's GPTModel holds (local layer indices)."""
    names = []
    if pp_rank == 0:
        names.append("embedding.word_embeddings.weight")
    for local in range(cfg.num_layers // pp):
        for rule in convert.rules_for(cfg.family):
            if "{i}" in rule.megatron and layouts.rule_applies(rule, cfg):
                names.append(rule.megatron.format(i=local))
    if pp_rank == pp - 1:
        names.append("decoder.final_layernorm.weight")
        if not cfg.tie_word_embeddings:
            names.append("output_layer.weight")
    return names


def megatron_shards(cfg, hf, tp, pp):
    """Every (tp_rank, pp_rank)'s Megatron parameters, converted from the HF state dict."""
    heads = convert.Heads(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
    out = {}
    for pp_rank in range(pp):
        offset = layouts.stage_layers(cfg.num_layers, pp, pp_rank).start
        for tp_rank in range(tp):
            params = {}
            for name in megatron_names(cfg, pp_rank, pp):
                rule, layer = convert.match(convert.rules_for(cfg.family), name)
                layer = None if layer is None else layer + offset
                params[name] = convert.hf_to_megatron(rule, layer, hf, heads, tp_rank, tp).clone()
            out[tp_rank, pp_rank] = params
    return out, heads


@pytest.mark.parametrize("arch", list(SPECS))
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_megatron_hf_round_trip_is_exact(arch, tp):
    cfg, hf = hf_model(arch)
    shards, heads = megatron_shards(cfg, hf, tp, 1)
    qkv = shards[0, 0]["decoder.layers.0.self_attention.linear_qkv.weight"]
    per_group = cfg.num_heads // cfg.num_kv_heads * cfg.head_dim
    # megatron's interleaved layout: the first group's q rows, then its k, then its v
    assert torch.equal(qkv[:per_group], hf["model.layers.0.self_attn.q_proj.weight"][:per_group])
    assert torch.equal(qkv[per_group:per_group + cfg.head_dim], hf["model.layers.0.self_attn.k_proj.weight"][:cfg.head_dim])
    back = {}
    for name in shards[0, 0]:
        rule, layer = convert.match(convert.rules_for(cfg.family), name)
        back.update(convert.megatron_to_hf(rule, layer, [shards[r, 0][name] for r in range(tp)], heads))
    expected = {k: v for k, v in hf.items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    assert back.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


def test_te_spec_names_fold_the_norms_into_the_linear_layers():
    rules = convert.rules_for(MODEL_FAMILIES.get("llama"), te_spec=True)
    rule, layer = convert.match(rules, "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight")
    assert layer == 3 and convert.hf_names(rule, layer) == ["model.layers.3.input_layernorm.weight"]
    assert convert.match(rules, "decoder.layers.3.input_layernorm.weight") is None


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2)])
def test_megatron_shards_reshard_exactly_into_rollout_layouts(tp, pp):
    """Layouts + named shards of every Megatron rank feed the generic planner; rollout tp=1 and a
    non-divisible tp=3 (the 16 rows of k and v split 6/5/5, across Megatron's 8/8) receive exactly the
    HF tensors."""
    cfg, hf = hf_model("qwen2")
    shards, heads = megatron_shards(cfg, hf, tp, pp)
    ranks = [(t, p) for p in range(pp) for t in range(tp)] * 2  # x2: a data-parallel replica of each
    coords = [layouts.RankCoord(t, p) for t, p in ranks]
    sources = layouts.hf_layouts(cfg, convert.rules_for(cfg.family), coords, tp, pp, torch.float32)
    src = {}
    for rank, (t, p) in enumerate(ranks):
        offset = layouts.stage_layers(cfg.num_layers, pp, p).start
        src[rank] = layouts.hf_named_shards(shards[t, p].items(), convert.rules_for(cfg.family), heads, tp, offset, cfg)
    assert {l.name for l in sources} == set(hf)
    for rollout_tp in (1, 3):
        targets = [sharded(l.name, l.shape, rollout_tp, dim=0) if len(l.shape) == 2 and "proj" in l.name
                   else replicated(l.name, l.shape, rollout_tp) for l in sources]
        dst = {r: {l.name: torch.full(l.local_shape(r), float("nan")) for l in targets} for r in range(rollout_tp)}
        transfers = plan_reshard(sources, targets)
        apply_in_process(transfers, src, dst)
        for layout in targets:
            for r in range(rollout_tp):
                box = tuple(slice(lo, hi) for lo, hi in layout.boxes[r])
                assert torch.equal(dst[r][layout.name], hf[layout.name][box]), (layout.name, r)
        assert {t.src_rank for t in transfers} >= {0, 1} or tp * pp == 1  # the planner spreads the sending


def test_importing_the_backend_does_not_import_megatron_and_a_missing_one_names_the_extra(monkeypatch):
    code = ("import sys, rlinf_like, rlinf_like.hybrid_engines.megatron; "
            "assert not [m for m in sys.modules if m.startswith('megatron')]")
    subprocess.run([sys.executable, "-c", code], check=True)
    from rlinf_like.hybrid_engines.megatron import MegatronModelManager

    monkeypatch.setitem(sys.modules, "megatron.core", None)
    with pytest.raises(MissingExtraError, match=r"\[megatron\]"):
        MegatronModelManager("unused")


def test_unsplittable_parallel_sizes_and_unsupported_models_are_refused_by_name():
    cfg, _ = hf_model("qwen2")  # 6 heads over 2 key/value heads, 4 layers
    check_parallel(cfg, 2, 2)
    with pytest.raises(ValueError, match=r"tensor_parallel=3 must divide the 2 key/value heads"):
        check_parallel(cfg, 3, 1)
    with pytest.raises(ValueError, match=r"pipeline_parallel=3 must divide the 4 layers"):
        check_parallel(cfg, 1, 3)
    with pytest.raises(ValueError, match=r"model_type 'gpt2' is not supported; supported: "
                                         r"\['llama', 'qwen2', 'qwen3', 'gemma3_text', 'qwen3_moe', 'mixtral'\]"):
        model_config({"model_type": "gpt2"})
