"""Which rollout engine to prefer, from what the engines declare (`RolloutEngine.cpu_real_model_choice`).

The native engine stays every run's default (the golden runs, the tests' tiny models, migration, TP without an
extra). An engine that declares `cpu_real_model_choice` (a measured reason) is the recommended CPU engine for
*real* checkpoints: when a run serves one on CPU with another engine and the recommended engine's extra is
importable, the run says so in one log line; nothing else changes. `engine_listing()` prints the registry with
each engine's capabilities and this recommendation (`python -m rlinf_like.config.show engines`).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

from rlinf_like.workers.rollout.base import RolloutConfig
from rlinf_like.workers.rollout.engine import engine_class, engine_names

log = logging.getLogger(__name__)

# "Real": a checkpoint whose config.json gives at least this many parameters. SmolLM2-135M (the smallest real
# model here) has ~135M; the tests' and examples' tiny random models have well under 10M.
REAL_MODEL_PARAMS = 100_000_000
CAPABILITIES = ("supports_tp", "continues_migrated", "rescored_logprobs", "returns_routes", "serves_continuously",
                "needs_gpu")


def parameter_count(hf: dict) -> int:
    """Parameters of a decoder-only checkpoint from its config.json: embeddings, per layer attention (q, k, v, o),
    a gated MLP (in a mixture-of-experts layer: every expert's, and the router) and two norms, the final norm, and an
    LM head unless tied."""
    from rlinf_like.utils.flops import moe_shape

    hidden, vocab, layers = hf["hidden_size"], hf["vocab_size"], hf["num_hidden_layers"]
    heads = hf["num_attention_heads"]
    kv_heads = hf.get("num_key_value_heads") or heads
    head_dim = hf.get("head_dim") or hidden // heads
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * hf.get("intermediate_size", 4 * hidden)
    moe = moe_shape(hf)  # {} for a dense model; a sparse layer holds every expert, not only the chosen ones
    sparse = moe.get("moe_layers", 0)
    experts = hidden * moe.get("experts", 0) * (1 + 3 * moe.get("expert_width", 0))
    head = 0 if hf.get("tie_word_embeddings", True) else vocab * hidden
    body = (layers - sparse) * mlp + sparse * experts + layers * (attention + 2 * hidden)
    return vocab * hidden + body + hidden + head


def is_real_model(model_path: str) -> bool:
    """A local checkpoint of at least REAL_MODEL_PARAMS parameters (hub ids and folders without a decoder
    config: not judged, False)."""
    from pathlib import Path

    from rlinf_like.models import read_hf_config

    if not model_path or not Path(model_path).is_dir():
        return False
    try:
        return parameter_count(read_hf_config(model_path, "rollout.model_path")) >= REAL_MODEL_PARAMS
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return False


def cpu_recommended_engines() -> list[str]:
    return [name for name in engine_names() if engine_class(name).cpu_real_model_choice]


def cpu_advice(config: RolloutConfig, device: str,
               importable: Callable[[str], bool] = lambda m: importlib.util.find_spec(m) is not None) -> str | None:
    """The line to log when `config` serves a real checkpoint on CPU with an engine other than the recommended
    one and the recommended engine can be built here (its `extra_module` importable); else None."""
    if not str(device).startswith("cpu") or config.engine in cpu_recommended_engines():
        return None
    if not is_real_model(config.model_path):
        return None
    for name in cpu_recommended_engines():
        engine = engine_class(name)
        if engine.extra_module is None or importable(engine.extra_module):
            return (f"rollout.engine={config.engine} on CPU with a real checkpoint ({config.model_path}, >= "
                    f"{REAL_MODEL_PARAMS // 10**6}M parameters): rollout.engine={name} is the recommended CPU engine "
                    f"for real models and is installed here: {engine.cpu_real_model_choice}")
    return None


def log_cpu_advice(config: RolloutConfig, device: str) -> str | None:
    """`cpu_advice`, logged once (a warning: it is about the run's speed, not its results); returns the line."""
    advice = cpu_advice(config, device)
    if advice is not None:
        log.warning(advice)
    return advice


def engine_listing() -> str:
    """Every registered engine with the capabilities it declares and the CPU recommendation."""
    lines = ["rollout engines (rollout.engine=NAME; capabilities as each engine class declares them):"]
    for name in engine_names():
        engine = engine_class(name)
        has = [c for c in CAPABILITIES if getattr(engine, c)]
        extra = f", needs the {engine.extra_module} extra" if engine.extra_module else ""
        lines.append(f"  {name}: {', '.join(has) or 'no optional capabilities'}{extra}")
        if engine.cpu_real_model_choice:
            lines.append(f"    recommended CPU engine for real models (>= {REAL_MODEL_PARAMS // 10**6}M parameters): "
                         f"{engine.cpu_real_model_choice}")
    return "\n".join(lines)
