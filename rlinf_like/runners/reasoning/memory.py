"""The actor's memory, estimated before any worker starts: what a rank holds whatever the batch (weights,
gradients, optimizer state), what each token of a micro-batch adds (the activations the backward keeps), and from
the two the token budget that sizes its micro-batches.

The per-token figure counts, per decoder layer, the tensors an HF Llama-style layer saves for its backward:
about 10 hidden-sized (norms, q/k/v, attention and MLP outputs, residuals) and 4 intermediate-sized (gate, up,
their activation and product), in fp32, with a quarter on top. Measured on SmolLM2-135M (30 layers, hidden 576,
intermediate 1536), one forward+backward on 8 x 128 tokens: 1.78 MB per token in fp32 and 1.56 MB under bf16
autocast, against 1.79 MB estimated (docs/benchmarks/training-step.md). The output layer never adds a [B, T, V] tensor
(hybrid_engines/head_stats.py): it adds a few chunks of `CHUNK_BYTES`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlinf_like.hybrid_engines.head_stats import CHUNK_BYTES

GB = 1e9
DEFAULT_SHARE = 0.3  # of this machine's memory, split over the actor's ranks, when actor.memory_gb is null
# A model whose weights and optimizer state leave that share no room for a row of FLOOR_TOKENS (256: the longest rows
# the default preset is held to; SmolLM2 keeps its share) gets what RAISED_TOKENS need, up to DEFAULT_CEILING of the
# machine, and its ranks trade speed for memory (FSDPConfig.lean: no unsharded weights held or gradients
# accumulated): the default runs it, not refuses. Gemma 3 270M (its 262k-row embedding is 63% of its weights), 2
# GRPO steps of the default preset: 512-token micro-batches peaked at +18.9 GB with 118-151 s steps, 256-token ones
# at +18.2 GB with 178-192 s steps (docs/benchmarks/training-step.md)
FLOOR_TOKENS = 256
RAISED_TOKENS = 512
DEFAULT_CEILING = 0.5
# the rollout's KV caches together, when rollout.kv_cache_memory_gb is unset (runners/reasoning/launch.py rollout_kv_budget):
# with the actor's share this keeps a collocated CPU run of a real model under 14 GB of a 24 GB machine
ROLLOUT_KV_SHARE = 0.08
RUNTIME_BYTES = 0.6 * GB  # python, torch and the worker's own state
REDUCE_KEYS = ("actor.memory_gb", "actor.loop.micro_batch_size", "actor.lora.rank", "runner.max_new_tokens",
               "cluster.component_placement.actor")


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    intermediate: int
    vocab: int
    params: int


@dataclass(frozen=True)
class ActorMemory:
    ranks: int
    budget: float  # bytes one rank may use
    static: float  # bytes per rank whatever the batch
    per_token: float  # bytes per micro-batch token
    raised: bool = False  # the default share could not hold the model: budget raised, the actor lean

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch that fit (0: not even one)."""
        return max(0, int((self.budget - self.static) // self.per_token))

    def describe(self) -> str:
        raised = "" if not self.raised else (
            f" (the default {DEFAULT_SHARE:.0%} of the machine cannot hold this model: raised to what {RAISED_TOKENS} "
            "tokens need; the actor gathers weights and reduces gradients per micro-batch)")
        return (f"{self.static / GB:.1f} GB whatever the batch + {self.per_token / 1e6:.2f} MB per token, "
                f"budget {self.budget / GB:.1f} GB per rank{raised}: {self.tokens} tokens per micro-batch")


def _hf_text_config(cfg) -> dict:
    """model.path's config.json (a multimodal checkpoint's text model's part)."""
    from rlinf_like.models import read_hf_config

    hf = read_hf_config(cfg.model.path, "model.path")
    return hf.get("text_config", hf)


def model_shape(cfg) -> ModelShape:
    """The policy's shape: from model.path's config.json, else the tiny model's keys."""
    from rlinf_like.workers.rollout.engines.engine_advice import parameter_count

    if cfg.model.path:
        hf = _hf_text_config(cfg)
        width = hf.get("intermediate_size", 4 * hf["hidden_size"])
        return ModelShape(hf["num_hidden_layers"], hf["hidden_size"], width, hf["vocab_size"], parameter_count(hf))
    m = cfg.model
    hf = {"hidden_size": m.hidden_size, "vocab_size": 128, "num_hidden_layers": m.num_layers,
          "num_attention_heads": m.num_heads, "num_key_value_heads": m.num_kv_heads,
          "intermediate_size": m.intermediate_size}
    return ModelShape(m.num_layers, m.hidden_size, m.intermediate_size, 128, parameter_count(hf))


def kv_bytes_per_token(cfg, dtype_bytes: int) -> int:
    """One token's keys and values over every layer of the policy."""
    if cfg.model.path:
        hf = _hf_text_config(cfg)
        layers, heads = hf["num_hidden_layers"], hf["num_attention_heads"]
        kv_heads, head_dim = hf.get("num_key_value_heads") or heads, hf.get("head_dim") or hf["hidden_size"] // heads
    else:
        m = cfg.model
        layers, kv_heads, head_dim = m.num_layers, m.num_kv_heads, m.hidden_size // m.num_heads
    return 2 * layers * kv_heads * head_dim * dtype_bytes


def rollout_kv_gb(cfg, replicas: int, prompt_tokens: int, dtype: str = "float32") -> float:
    """The native engine's KV cache for this run: every slot a replica can fill (its share of a step's samples, at
    most rollout.max_batch_size) holding the longest prompt seen plus runner.max_new_tokens, with a quarter on top.
    A longer prompt later still runs: the paged cache then admits fewer sequences at a time."""
    r = cfg.runner
    samples = r.prompts_per_step * cfg.algorithm.samples_per_prompt
    slots = min(cfg.rollout.max_batch_size, -(-samples // max(1, replicas)))
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]  # the resolved rollout.dtype
    token = kv_bytes_per_token(cfg, dtype_bytes)
    # the engine refuses a cache that cannot hold one sequence of its whole context (plus a scratch block)
    block = cfg.rollout.kv_block_size
    one_sequence = (-(-context_tokens(cfg) // block) + 2) * block * token
    return max(1.25 * slots * (prompt_tokens + r.max_new_tokens) * token, one_sequence) / 2**30


def context_tokens(cfg) -> int:
    """rollout.max_context, else the policy's own context."""
    if cfg.rollout.max_context:
        return cfg.rollout.max_context
    if cfg.model.path:
        return _hf_text_config(cfg)["max_position_embeddings"]
    return cfg.model.max_positions


def machine_bytes() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def available_bytes() -> float:
    """MemAvailable (Linux), else the machine's memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return machine_bytes()


def actor_memory(cfg, ranks: int) -> ActorMemory:
    shape = model_shape(cfg)
    budget = cfg.actor.memory_gb * GB if cfg.actor.memory_gb else DEFAULT_SHARE * machine_bytes() / ranks
    lora = cfg.actor.lora
    # LoRA trains ~2 * rank * (in + out) per adapted matrix: a small share; bound it by 1% of the base per rank 16
    trainable = shape.params * min(1.0, 0.01 * lora.rank / 16) if lora.rank > 0 else shape.params
    # fp32 weights, then per trainable weight its fp32 gradient and Adam's two moments (sharded over the ranks),
    # and a bf16 copy under autocast
    static = 4 * shape.params + 12 * trainable / ranks + 2 * shape.params + RUNTIME_BYTES + 3 * CHUNK_BYTES
    per_token = 1.25 * 4 * shape.layers * (10 * shape.hidden + 4 * shape.intermediate)
    if not cfg.actor.memory_gb and budget < static + FLOOR_TOKENS * per_token:
        raised = min(static + RAISED_TOKENS * per_token, DEFAULT_CEILING * machine_bytes() / ranks)
        return ActorMemory(ranks, raised, static, per_token, raised=True)
    return ActorMemory(ranks, budget, static, per_token)


def check_actor_memory(memory: ActorMemory, row_tokens: int, rows: int | None) -> None:
    """Refuse, before any worker starts, a plan whose actor cannot fit: not one row, or `rows` rows (an explicit
    actor.loop.micro_batch_size) of `row_tokens` tokens, naming the estimate and the keys that reduce it."""
    need_rows = rows or 1
    need = memory.static + need_rows * row_tokens * memory.per_token
    if need <= memory.budget:
        return
    what = f"{need_rows} row(s) of up to {row_tokens} tokens"
    raise ValueError(f"actor: a micro-batch of {what} needs ~{need / GB:.1f} GB per rank, over its "
                     f"{memory.budget / GB:.1f} GB ({memory.describe()}). Reduce it with: " + ", ".join(REDUCE_KEYS)
                     + " (more ranks), or raise actor.memory_gb")
