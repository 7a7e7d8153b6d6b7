"""Small HF causal LMs and a character tokenizer, made locally (the Hub is out of reach here).

`write_tiny_model(path)` saves a real transformers checkpoint (config.json, model.safetensors,
tokenizer files) that every loader in the project reads the normal way (`from_pretrained`,
safetensors), so swapping in a downloaded Qwen2/Llama checkpoint changes only the path.
The initialisation is wider than HF's default so next-token distributions are peaked: greedy
decoding then has clear winners, which exact-match tests need.
"""

from __future__ import annotations

import json
import string
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"


@dataclass(frozen=True)
class TinyModelSpec:
    # "qwen2" (q/k/v biases), "llama", "qwen3" (q/k norms), "gemma3" (see GEMMA3_TEXT), or the mixtures of
    # experts "qwen3_moe" and "mixtral"
    arch: str = "qwen2"
    hidden_size: int = 64
    intermediate_size: int = 176
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 256
    tie_word_embeddings: bool = False
    init_std: float = 0.5
    seed: int = 0
    head_dim: int | None = None  # None: hidden_size // num_heads
    # Llama-3 RoPE scaling (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
    llama3_rope: tuple[float, float, float, int] | None = None
    attention_bias: bool = False  # llama / qwen3: biases on q, k, v and the output projection
    sliding_window: int = 8  # gemma3: its sliding layers' window, small so that short prompts pass it
    # mixtures of experts: experts, the router's top-k, one expert's width (mixtral: intermediate_size), the
    # layers that keep a dense MLP (qwen3_moe) and whether the top-k probabilities are renormalised (qwen3_moe)
    num_experts: int = 4
    experts_per_token: int = 2
    moe_intermediate_size: int = 48
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = False


def char_tokenizer():
    """A character-level fast tokenizer: one token per ASCII character, so token counts are predictable.
    It is byte-level BPE with no merges (a space is the symbol "Ġ", as in GPT-2 / Qwen2 vocabularies): the
    tokenizer transformers builds for a qwen2 checkpoint from these files (`AutoTokenizer` ignores a saved
    tokenizer class there) then gives the same ids, so an exported tiny model loads faithfully. A non-ASCII
    character is one unknown token per byte."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbol = bytes_to_unicode()
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *(symbol[ord(c)] for c in CHARACTERS)))}
    core = Tokenizer(models.BPE(vocab, [], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


TINY_ARCHS = ("qwen2", "llama", "qwen3", "gemma3", "qwen3_moe", "mixtral")
# Gemma 3's two RoPE bases (full layers, sliding layers) and its attention scale differing from head_dim^-1/2,
# so that a decoder reading the wrong base or scale disagrees with transformers
GEMMA3_TEXT = dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                   query_pre_attn_scalar=24)


def tiny_config(spec: TinyModelSpec, vocab_size: int, special: dict[str, int]):
    from transformers import Gemma3TextConfig, LlamaConfig, MixtralConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    if spec.arch not in TINY_ARCHS:
        raise ValueError(f"tiny model arch {spec.arch!r}: choose one of {list(TINY_ARCHS)}")
    extra = {} if spec.head_dim is None else {"head_dim": spec.head_dim}
    if spec.arch == "gemma3":  # every other layer sliding, the last one full
        extra.update(GEMMA3_TEXT, sliding_window=spec.sliding_window, layer_types=[
            "full_attention" if (i + 1) % 2 == 0 or i == spec.num_layers - 1 else "sliding_attention"
            for i in range(spec.num_layers)])
        extra.setdefault("head_dim", spec.hidden_size // spec.num_heads)  # Gemma's default (256) is not that
    elif spec.llama3_rope is None:
        extra["rope_theta"] = 10000.0
    else:
        factor, low, high, original = spec.llama3_rope
        extra["rope_parameters"] = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": factor,
                                    "low_freq_factor": low, "high_freq_factor": high,
                                    "original_max_position_embeddings": original}
    if spec.attention_bias:
        extra["attention_bias"] = True
    intermediate = spec.intermediate_size
    if spec.arch == "qwen3_moe":
        extra.update(num_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token, decoder_sparse_step=1,
                     moe_intermediate_size=spec.moe_intermediate_size, mlp_only_layers=list(spec.mlp_only_layers),
                     norm_topk_prob=spec.norm_topk_prob)
    elif spec.arch == "mixtral":
        extra.update(num_local_experts=spec.num_experts, num_experts_per_tok=spec.experts_per_token)
        intermediate = spec.moe_intermediate_size
    common = dict(
        vocab_size=vocab_size, hidden_size=spec.hidden_size, intermediate_size=intermediate,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings, initializer_range=spec.init_std, rms_norm_eps=1e-6,
        **extra, **special,
    )
    return {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen3": Qwen3Config, "gemma3": Gemma3TextConfig,
            "qwen3_moe": Qwen3MoeConfig, "mixtral": MixtralConfig}[spec.arch](**common)


def build_tiny_model(spec: TinyModelSpec = TinyModelSpec()):
    """(model, tokenizer): a randomly initialised HF causal LM over the character vocabulary."""
    from transformers import AutoModelForCausalLM

    tokenizer = char_tokenizer()
    special = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                   eos_token_id=tokenizer.eos_token_id)
    config = tiny_config(spec, len(tokenizer), special)
    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # biases too (HF zeroes them): the q/k/v bias path must be exercised
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, spec.init_std)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):  # HF makes them 1: a dropped norm would pass
                param.uniform_(0.5, 1.5)
            elif spec.arch == "gemma3" and name.endswith("norm.weight"):  # HF's 0 scales by 1 + 0: so would a bug
                param.uniform_(-0.5, 0.5)
            elif name.endswith("mlp.gate.weight"):  # HF zeroes routers: every token would tie over the experts
                param.normal_(0.0, spec.init_std)
    return model.eval(), tokenizer


def write_tiny_model(path: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Save a tiny model + tokenizer as an HF checkpoint directory (idempotent for the same spec)."""
    path = Path(path)
    marker = path / "tiny_spec.json"
    if marker.exists() and json.loads(marker.read_text()) == json.loads(json.dumps(asdict(spec))):
        return path
    model, tokenizer = build_tiny_model(spec)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    marker.write_text(json.dumps(asdict(spec)))
    return path


def end_turns_like(path: str | Path, char: str = "z", scale: float = 1.3) -> Path:
    """Make the saved tiny model at `path` end its turn (write EOS) where it would have written `char`: EOS's
    output row becomes `scale` times that character's. A random model then stops after a dozen or so tokens, as a
    chat model ends its turns, which multi-turn rollouts need (the random one mostly runs to its token limit)."""
    from safetensors.torch import load_file, save_file

    path = Path(path)
    tokenizer = char_tokenizer()
    weights = load_file(path / "model.safetensors")
    head = "lm_head.weight" if "lm_head.weight" in weights else "model.embed_tokens.weight"
    rows = weights[head].clone()
    rows[tokenizer.eos_token_id] = scale * rows[tokenizer.convert_tokens_to_ids(char)]
    save_file({**weights, head: rows}, path / "model.safetensors", metadata={"format": "pt"})
    (path / "tiny_spec.json").unlink(missing_ok=True)  # no longer the spec's model: write_tiny_model rewrites it
    return path
