"""LoRA adapters (through `peft`) on the FSDP manager's model: config, wrapping, merged weights, names.

With `LoraConfig.rank > 0` the HF model is wrapped by `peft.get_peft_model` before FSDP shards it: the base
weights are frozen (`requires_grad=False`), only the adapters' A and B matrices train. What the rest of the
system sees stays the base model's: the weight sync and the HF export carry merged weights
W + (alpha / r) * B @ A under the base model's parameter names (peft's names never leave the manager).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rlinf_like.config.validate import bounded

ALL_LINEAR = "all-linear"  # peft's name for every nn.Linear of the blocks (the output head excluded)
ADAPTER = "default"  # peft's adapter name; one adapter per model
PEFT_PREFIX = "base_model.model."


@dataclass(kw_only=True)
class LoraConfig:
    rank: int = bounded(0, ge=0)  # LoRA rank r; 0 = off (full fine-tuning)
    alpha: float = bounded(16.0, gt=0)  # scaling numerator: the update is (alpha / rank) * B @ A
    dropout: float = bounded(0.0, ge=0, lt=1)  # dropout on the adapters' input while training
    # module names to adapt (e.g. [q_proj, v_proj]); empty: every linear layer of the decoder blocks
    target_modules: list[str] = field(default_factory=list)

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def peft_config(self):
        from peft import LoraConfig as PeftLoraConfig

        return PeftLoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                              target_modules=list(self.target_modules) or ALL_LINEAR, task_type="CAUSAL_LM")


def check_lora(config: LoraConfig, key: str = "actor.lora") -> None:
    """Values the schema's bounds do not cover (a config built in Python skips them), named by key."""
    if config.rank < 0:
        raise ValueError(f"{key}.rank must be >= 0 (0 = off), got {config.rank}")
    if config.enabled and config.alpha <= 0:
        raise ValueError(f"{key}.alpha must be > 0, got {config.alpha}")
    if not 0 <= config.dropout < 1:
        raise ValueError(f"{key}.dropout must be in [0, 1), got {config.dropout}")
    bad = [m for m in config.target_modules if not isinstance(m, str) or not m]
    if bad:
        raise ValueError(f"{key}.target_modules must be module names (e.g. [q_proj, v_proj]), got {bad}")


def check_targets(config: LoraConfig, model: nn.Module, key: str = "actor.lora") -> None:
    """Every named target must be a linear layer of `model` (which may live on the meta device)."""
    if not config.target_modules:
        return
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)}
    missing = sorted(set(config.target_modules) - linear)
    if missing:
        raise ValueError(f"{key}.target_modules names {missing}, which are not linear layers of the model; "
                         f"its linear layers are {sorted(linear)}")


def check_targets_of(config: LoraConfig, model_path: str, key: str = "actor.lora") -> None:
    """`check_targets` on the checkpoint at `model_path`, built on the meta device (no weights read)."""
    if not config.enabled or not config.target_modules:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    check_targets(config, model, key)


def wrap(model: nn.Module, config: LoraConfig) -> nn.Module:
    """The peft model around `model`: base frozen, adapters trainable (B starts at zero, so the wrapped
    model computes exactly what `model` did)."""
    from peft import get_peft_model

    check_targets(config, model)
    return get_peft_model(model, config.peft_config())


def base_name(name: str) -> str:
    """peft's parameter name -> the base model's (`base_model.model.x.q_proj.base_layer.weight` ->
    `x.q_proj.weight`)."""
    if name.startswith(PEFT_PREFIX):
        name = name[len(PEFT_PREFIX):]
    return name.replace(".base_layer.", ".")


def is_adapter(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name or ".lora_embedding_" in name


def targets(named: dict[str, torch.Tensor]) -> dict[str, tuple[str, str]]:
    """peft name of each adapted base weight -> the peft names of its (A, B)."""
    out = {}
    for name in named:
        if name.endswith(".base_layer.weight"):
            module = name[: -len(".base_layer.weight")]
            a, b = f"{module}.lora_A.{ADAPTER}.weight", f"{module}.lora_B.{ADAPTER}.weight"
            if a in named and b in named:
                out[name] = (a, b)
    return out


def merge(weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """W + (B @ A) * scaling, computed as peft's merge does (`get_delta_weight`), rows of B as given: on
    an FSDP rank, `weight` and `b` are the rank's rows and `a` is whole."""
    return weight + (b @ a) * scaling


@torch.no_grad()
def merged_full(state: dict[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """A full (unsharded) peft state dict -> the merged base model's state dict, base names."""
    pairs = targets(state)
    return {base_name(n): merge(t, state[pairs[n][0]], state[pairs[n][1]], scaling) if n in pairs else t
            for n, t in state.items() if not is_adapter(n)}


def sync_name(name: str) -> str:
    """peft's name -> the name a weight sync uses: base names for base weights, `x.q_proj.lora_A.weight` for an
    adapter (`lora_sync.adapter_names`)."""
    return base_name(name).replace(f".{ADAPTER}.", ".")


def sync_names(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base weights (unmerged) and the adapters, under their sync names."""
    return {sync_name(n): t for n, t in named.items()}


def adapter_sync_names(named: dict[str, torch.Tensor]) -> list[str]:
    """Sync names of the tensors LoRA training changes: the adapters (everything else is frozen)."""
    return sorted(sync_name(n) for n in named if is_adapter(n))
