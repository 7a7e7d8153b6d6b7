"""Sparse upcycling: a dense Llama-family checkpoint made into a Mixtral mixture of experts.

Every layer's MLP becomes `--experts` experts, each a copy of the dense MLP plus Gaussian noise of `--noise` times
the weight's own standard deviation, and a router of random weights (std `--router-std`) picks `--top-k` of them
per token, their weights renormalised to sum to 1. With `--noise 0` every expert is the dense MLP, so the model
computes the dense model's function (to float rounding): the noise is what makes routes matter, and the router's
width is what makes them differ from token to token. Attention, norms, embeddings and the tokenizer are copied.

    python -m rlinf_like.models.upcycle smollm2 --experts 4 --top-k 2 --out models/smollm2-135m-moe4x2

`smollm2` names models/smollm2-135m-instruct; any folder of a `llama` checkpoint works.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

ALIASES = {"smollm2": "models/smollm2-135m-instruct"}
_MLP = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}  # dense name -> Mixtral expert name


def mixtral_config(dense: dict, experts: int, top_k: int) -> dict:
    """The Mixtral config.json of the upcycled model: the dense config's sizes, one expert per MLP copy."""
    if dense.get("model_type") != "llama":
        raise ValueError(f"upcycle: model_type {dense.get('model_type')!r} is not supported (supported: ['llama'])")
    if not 1 <= top_k <= experts:
        raise ValueError(f"upcycle: --top-k {top_k} must be between 1 and --experts {experts}")
    from transformers import MixtralConfig

    keep = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "bos_token_id",
            "eos_token_id", "pad_token_id", "head_dim", "rope_parameters", "rope_theta", "rope_scaling")
    fields = {k: dense[k] for k in keep if dense.get(k) is not None}
    config = MixtralConfig(**fields, num_local_experts=experts, num_experts_per_tok=top_k, router_jitter_noise=0.0,
                           sliding_window=None, hidden_act="silu", attention_bias=False)
    return {**config.to_dict(), "torch_dtype": dense.get("torch_dtype", dense.get("dtype", "float32"))}


def upcycle_weights(dense: dict[str, torch.Tensor], layers: int, experts: int, noise: float, router_std: float,
                    seed: int) -> dict[str, torch.Tensor]:
    """Mixtral's checkpoint tensors (per-expert names) from a dense Llama state dict."""
    gen = torch.Generator().manual_seed(seed)
    out = {name: t for name, t in dense.items() if ".mlp." not in name}
    for i in range(layers):
        prefix, moe = f"model.layers.{i}.mlp.", f"model.layers.{i}.block_sparse_moe."
        hidden = dense[prefix + "gate_proj.weight"].shape[1]
        out[moe + "gate.weight"] = (torch.randn(experts, hidden, generator=gen) * router_std).to(
            dense[prefix + "gate_proj.weight"].dtype)
        for e in range(experts):
            for name, short in _MLP.items():
                weight = dense[prefix + name + ".weight"]
                jitter = torch.randn(weight.shape, generator=gen) * (noise * weight.float().std())
                out[moe + f"experts.{e}.{short}.weight"] = (weight.float() + jitter).to(weight.dtype)
    return out


def upcycle(source: str | Path, out: str | Path, experts: int = 4, top_k: int = 2, noise: float = 0.01,
            router_std: float = 0.2, seed: int = 0) -> Path:
    from safetensors.torch import load_file, save_file

    source, out = Path(ALIASES.get(str(source), source)), Path(out)
    dense_cfg = json.loads((source / "config.json").read_text())
    config = mixtral_config(dense_cfg, experts, top_k)
    files = sorted(source.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"upcycle: no *.safetensors in {source}")
    dense = {name: t for f in files for name, t in load_file(str(f)).items()}
    weights = upcycle_weights(dense, dense_cfg["num_hidden_layers"], experts, noise, router_std, seed)
    out.mkdir(parents=True, exist_ok=True)
    for f in source.iterdir():  # tokenizer, chat template, generation config
        if f.is_file() and f.suffix != ".safetensors" and f.name not in ("config.json", "model.safetensors.index.json"):
            shutil.copy2(f, out / f.name)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help=f"a llama checkpoint folder, or one of {list(ALIASES)}")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.01, help="each expert's noise, times the weight's std")
    parser.add_argument("--router-std", type=float, default=0.2, help="the router weights' std")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="default: models/<name>-moe<experts>x<top-k>")
    args = parser.parse_args(argv)
    name = Path(ALIASES.get(args.model, args.model)).name
    out = args.out or f"models/{name}-moe{args.experts}x{args.top_k}"
    path = upcycle(args.model, out, args.experts, args.top_k, args.noise, args.router_std, args.seed)
    print(f"upcycled {args.model} to {path}: {args.experts} experts, top-{args.top_k}, noise {args.noise}, "
          f"router std {args.router_std}")


if __name__ == "__main__":
    main()
