"""A Llama / Qwen2 / Qwen3-style decoder for inference, tensor-parallel, over a paged KV cache.

Weights keep their HF checkpoint names, so the weight sync needs no name map. Under tensor
parallelism (tp > 1, over the worker group's process group) each rank holds a slice of the heads
and of the MLP: q/k/v and gate/up are split by output rows (column parallel), o_proj and down_proj
by input columns (row parallel, then one all-reduce each); the embedding and the LM head are split
by vocabulary rows (vocab parallel: a rank looks up only its own rows, then one all-reduce; its LM
head computes its own slice of the logits, then one all-gather); norms are replicated. Which
weight splits how, and which are fused, is read from the model family
(`rlinf_like.models.families`). The numerics follow transformers' implementation (fp32 RMSNorm, the same RoPE), so
greedy decoding reproduces HF tokens.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlinf_like.hybrid_engines.reshard.layout import TensorLayout, replicated, sharded, split_bounds
from rlinf_like.models.families import ModelConfig, Weight
from rlinf_like.workers.rollout.engines.native.experts import experts_mlp
from rlinf_like.workers.rollout.engines.native.loading import load_shards  # noqa: F401  (the engine's loader)
from rlinf_like.workers.rollout.engines.native.layers import (
    decode_attention,
    gelu_tanh,
    rms_norm,
    rms_norm_plus_one,
    rope_inv_freq,
    rotate_half,
    window_mask,
)
from rlinf_like.workers.rollout.engines.native.mirror import DecodeMirror, padded_span
from rlinf_like.workers.rollout.engines.native.packed import PackedWeights


def weight_layouts(cfg: ModelConfig, tp: int, dtype: torch.dtype) -> list[TensorLayout]:
    """Every weight's global shape and the box each TP rank holds (HF names), as the family splits it
    (vocabulary-parallel weights by rows, balanced: a vocabulary that tp does not divide is fine)."""
    if cfg.num_heads % tp or cfg.num_kv_heads % tp:
        raise ValueError(f"native engine: tp={tp} must divide the {cfg.num_heads} attention heads and "
                         f"{cfg.num_kv_heads} key/value heads")
    if tp > 1 and cfg.is_moe_model:
        raise ValueError(f"native engine: a mixture-of-experts model ({cfg.family.name}) runs at rollout.tp=1 "
                         f"(got {tp}): splitting experts across ranks is not built; use more rollout replicas")
    out = []
    for name, weight in cfg.named_weights():
        if weight.parallel in ("column", "row", "vocab"):
            out.append(sharded(name, cfg.shape(weight), tp, dim=weight.tp_dim, dtype=str(dtype)))
        else:
            out.append(replicated(name, cfg.shape(weight), tp, str(dtype)))
    return out


def model_config(path: str | Path) -> ModelConfig:
    return ModelConfig.from_path(path, "native engine", hint="use rollout.engine=hf or sglang")


def fused_name(group: tuple[Weight, ...]) -> str:
    """Where the native engine keeps a fused group: "model.layers.{i}.self_attn.q_proj.weight", k, v ->
    "model.layers.{i}.self_attn.qkv.weight" (their common scope, the fusion, the suffix)."""
    names = [w.hf for w in group]
    scope = os.path.commonprefix(names)
    return scope[:scope.rfind(".") + 1] + group[0].fuse + names[0][names[0].rfind("."):]


def fuse_projections(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Store each of the family's fused groups (q/k/v, gate/up) of each layer in one tensor, and put
    views of it back under the HF names: the decoder runs one matmul instead of three (two), and a
    weight sync or an offload that writes the named views writes the fused tensor."""
    fused = dict(weights)
    groups = [g for g in cfg.family.parameter_groups() if g[0].fuse != "none" and cfg.has(g[0])]
    for i in range(cfg.num_layers):
        for group in groups:
            if not cfg.has(group[0], i):  # a dense MLP's gate/up in a mixture-of-experts layer
                continue
            names = [w.hf.format(i=i) for w in group]
            whole = torch.cat([weights[n] for n in names])
            fused[fused_name(group).format(i=i)] = whole
            for name, view in zip(names, whole.split([weights[n].shape[0] for n in names])):
                fused[name] = view
    return fused


@dataclass(frozen=True)
class Chunk:
    """The part of one sequence a prefill computes: tokens `ids` at positions start, start + 1, ..., after
    `start` tokens whose keys/values are already in the cache (a cached prefix)."""

    ids: list[int]
    start: int
    rows: list[int]  # cache rows of positions 0 .. start + len(ids) - 1 (read when start > 0)
    write_rows: list[int]  # where the new keys/values go: cache rows ...
    write_index: list[int]  # ... of the tokens ids[write_index[w]] (a token may go to several rows: copies)


def kv_bytes_per_token(cfg: ModelConfig, tp: int, dtype: torch.dtype) -> int:
    """Bytes of keys + values one token takes in one TP rank's cache, over all layers."""
    return 2 * cfg.num_layers * (cfg.num_kv_heads // tp) * cfg.head_dim * torch.empty((), dtype=dtype).element_size()


class Decoder:
    """Forward passes over weights `w` (this rank's shards) and a paged KV cache.

    The cache is `blocks` blocks of `block_size` token rows per layer and key/value head, kept as
    [layers, kv_heads, blocks * block_size, head_dim] for keys and for values: token row
    `block * block_size + offset`. Which blocks a sequence owns is the caller's block table; block 0
    is the engine's scratch block, which no sequence owns. `prefill` runs several sequences' `Chunk`s in
    one pass, each after its cached prefix (read from the cache); `decode` one token for each of a
    batch of sequences; `score` a whole sequence without the cache."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], tp_group=None, fp32_onednn: bool = False):
        self.cfg, self.w, self.tp_group = cfg, weights, tp_group
        tp = dist.get_world_size(tp_group) if tp_group is not None else 1
        rank = dist.get_rank(tp_group) if tp_group is not None else 0
        self.heads, self.kv_heads = cfg.num_heads // tp, cfg.num_kv_heads // tp
        # this rank's vocabulary rows of the embedding and the LM head (all of them without TP)
        self.vocab_bounds = split_bounds(cfg.vocab_size, tp)
        self.vocab_lo, self.vocab_hi = self.vocab_bounds[rank]
        # RoPE per attention kind ("full" / "sliding": Gemma 3's sliding-window layers have their own base)
        self.kinds = ["sliding" if cfg.is_sliding(i) else "full" for i in range(cfg.num_layers)]
        self.inv_freq = {kind: rope_inv_freq(cfg, sliding=kind == "sliding") for kind in set(self.kinds)}
        self.norm = rms_norm_plus_one if cfg.family.norm_plus_one else rms_norm
        self.act = gelu_tanh if cfg.family.activation == "gelu_tanh" else F.silu
        self.scale = cfg.attn_scale  # None: the kernels' own head_dim ** -0.5
        # sqrt(hidden) rounded to the weights' dtype first, as transformers multiplies by it
        self.embed_scale = float(torch.tensor(cfg.hidden_size ** 0.5, dtype=weights["model.embed_tokens.weight"].dtype))
        self.k_cache: torch.Tensor | None = None
        self.v_cache: torch.Tensor | None = None
        self.block_size = 0
        self.mirror = DecodeMirror()
        self.packed = PackedWeights(fp32_onednn)
        # mixture of experts: while set, each pass appends every MoE layer's chosen experts to `routes`
        self.capture_routes = False
        self.routes: list[torch.Tensor] = []

    def allocate_cache(self, blocks: int, block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        shape = (self.cfg.num_layers, self.kv_heads, blocks * block_size, self.cfg.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    def free_cache(self) -> None:
        self.k_cache = self.v_cache = None
        self.mirror.drop()
        self.packed.drop()

    def cache_bytes(self) -> int:
        return 0 if self.k_cache is None else 2 * self.k_cache.numel() * self.k_cache.element_size()

    # --- pieces -----------------------------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """(cos, sin) [B, 1, S, hd] per attention kind, once per pass for all layers."""
        out = {}
        for kind, inv_freq in self.inv_freq.items():
            if inv_freq.device != positions.device:  # moved once: a captured graph may copy nothing from the host
                inv_freq = self.inv_freq[kind] = inv_freq.to(positions.device)
            freqs = positions.float()[..., None] * inv_freq  # [B, S, hd/2]
            emb = torch.cat((freqs, freqs), dim=-1)
            out[kind] = emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]
        return out

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return self.packed.linear(x, name + ".weight", self.w[name + ".weight"], self.w.get(name + ".bias"))

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_group is not None:
            dist.all_reduce(x, group=self.tp_group)
        return x

    def _row_linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """A row-parallel linear: each rank's partial product, summed over ranks, then the bias added once."""
        out = self._reduce(self.packed.linear(x, name + ".weight", self.w[name + ".weight"]))
        bias = self.w.get(name + ".bias")
        return out if bias is None else out + bias

    def _attention_input(self, x: torch.Tensor, layer: int, rope: dict[str, tuple[torch.Tensor, torch.Tensor]]):
        b, s, _ = x.shape
        p = f"model.layers.{layer}.self_attn."
        hd = self.cfg.head_dim
        q, k, v = self._linear(x, p + "qkv").split([self.heads * hd, self.kv_heads * hd, self.kv_heads * hd], -1)
        q, k = q.view(b, s, self.heads, hd), k.view(b, s, self.kv_heads, hd)
        if self.cfg.qk_norm:  # per head, over head_dim, before RoPE (Qwen3, Gemma 3)
            q = self.norm(q, self.w[p + "q_norm.weight"], self.cfg.rms_norm_eps)
            k = self.norm(k, self.w[p + "k_norm.weight"], self.cfg.rms_norm_eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(b, s, self.kv_heads, hd).transpose(1, 2)
        cos, sin = rope[self.kinds[layer]]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return q, k, v

    def _block(self, x: torch.Tensor, layer: int, attend) -> torch.Tensor:
        p, eps, sandwich = f"model.layers.{layer}.", self.cfg.rms_norm_eps, self.cfg.family.sandwich_norm
        h = self.norm(x, self.w[p + "input_layernorm.weight"], eps)
        attn = attend(h, layer)  # [B, heads, S, hd]
        b, _, s, _ = attn.shape
        attn = self._row_linear(attn.transpose(1, 2).reshape(b, s, -1), p + "self_attn.o_proj")
        if sandwich:  # Gemma: the attention output normed, then a separate norm before the MLP
            x = x + self.norm(attn, self.w[p + "post_attention_layernorm.weight"], eps)
            h = self.norm(x, self.w[p + "pre_feedforward_layernorm.weight"], eps)
        else:
            x = x + attn
            h = self.norm(x, self.w[p + "post_attention_layernorm.weight"], eps)
        if self.cfg.is_moe(layer):
            mlp = self._experts(h, p + "mlp.")
        else:
            gate, up = self._linear(h, p + "mlp.gate_up").chunk(2, dim=-1)
            mlp = self._row_linear(self.act(gate) * up, p + "mlp.down_proj")
        if sandwich:
            mlp = self.norm(mlp, self.w[p + "post_feedforward_layernorm.weight"], eps)
        return x + mlp

    def _experts(self, h: torch.Tensor, p: str) -> torch.Tensor:
        """A mixture-of-experts MLP (native/experts.py); each pass's chosen experts go to `self.routes` (one [tokens,
        k] tensor per MoE layer, in layer order) while `self.capture_routes` is set."""
        out, chosen = experts_mlp(h, self.w[p + "gate.weight"], self.w[p + "experts.gate_up_proj"],
                                  self.w[p + "experts.down_proj"], self.cfg, self.act)
        if self.capture_routes:
            self.routes.append(chosen)
        return out

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        table = self.w["model.embed_tokens.weight"]
        if self.tp_group is None:
            x = table[ids]
        else:
            local = ids - self.vocab_lo
            outside = (local < 0) | (local >= table.shape[0])
            x = table[local.clamp(0, table.shape[0] - 1)].masked_fill_(outside[..., None], 0)
            x = self._reduce(x)  # every token's row comes from the one rank holding it, zeros elsewhere
        if self.cfg.family.embed_scale:
            x = x * self.embed_scale
        return x

    def _logits(self, x: torch.Tensor, as_float: bool = True) -> torch.Tensor:
        """Logits [rows, V]: float32, or (`as_float=False`) in the weights' dtype for a caller that converts them
        into a buffer of its own (the sampler: a fresh [B, V] float32 tensor a step costs its page faults)."""
        x = self.norm(x, self.w["model.norm.weight"], self.cfg.rms_norm_eps)
        head = "model.embed_tokens.weight" if self.cfg.tie_word_embeddings else "lm_head.weight"
        logits = self.packed.linear(x, head, self.w[head])
        logits = logits.float() if as_float else logits
        if self.tp_group is None:
            return logits
        # vocab parallel: each rank has its rows' logits; gather them (padded to the largest shard)
        width = max(hi - lo for lo, hi in self.vocab_bounds)
        padded = F.pad(logits, (0, width - logits.shape[-1])).contiguous()
        parts = [torch.empty_like(padded) for _ in self.vocab_bounds]
        dist.all_gather(parts, padded, group=self.tp_group)
        return torch.cat([part[..., : hi - lo] for part, (lo, hi) in zip(parts, self.vocab_bounds)], dim=-1)

    # --- passes -----------------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, chunks: Sequence[Chunk],
                 writes: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        """Run the tokens of several sequences' chunks, concatenated in ids [M] at `positions` [M], in one pass:
        the linear layers over all M together, attention chunk by chunk (causal, after the chunk's cached
        prefix, read from the cache). `writes` (cache rows [W], token indices [W]): store each layer's
        keys/values of token index[w] at row rows[w] first, so a chunk reads the rows it (or another chunk
        of this pass) writes. Hidden states [M, hidden]."""
        rope = self._rope(positions[None], self.w["model.norm.weight"].dtype)
        gqa = self.heads != self.kv_heads
        cached = [c for c in chunks if c.start > 0]  # read from the cache: one gather per layer for all of them
        gather = torch.tensor([r for c in cached for r in c.rows], device=ids.device) if cached else None
        # per chunk and attention kind: None (plain causal, the fused kernel's own mask) or a boolean mask
        window = {"full": None, "sliding": self.cfg.sliding_window}
        masks = [{kind: window_mask(c.start, len(c.ids), window[kind], ids.device) for kind in self.inv_freq}
                 for c in chunks]

        def attend(h, layer):
            q, k, v = self._attention_input(h, layer, rope)
            kind = self.kinds[layer]
            if writes is not None:
                self.k_cache[layer][:, writes[0]] = k[0][:, writes[1]]
                self.v_cache[layer][:, writes[0]] = v[0][:, writes[1]]
            if not cached and len(chunks) == 1:
                mask = masks[0][kind]
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                                      scale=self.scale, enable_gqa=gqa)
            if cached:
                keys = self.k_cache[layer].index_select(1, gather)[None]
                values = self.v_cache[layer].index_select(1, gather)[None]
            out, offset, read = [], 0, 0
            for chunk, mask in zip(chunks, masks):
                m, mask = len(chunk.ids), mask[kind]
                qc = q[:, :, offset:offset + m]
                if chunk.start == 0:
                    kc, vc = k[:, :, offset:offset + m], v[:, :, offset:offset + m]
                else:
                    n = len(chunk.rows)
                    kc, vc = keys[:, :, read:read + n], values[:, :, read:read + n]
                    read += n
                out.append(F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, is_causal=mask is None,
                                                          scale=self.scale, enable_gqa=gqa))
                offset += m
            return torch.cat(out, dim=2)

        x = self._embed(ids)[None]
        for layer in range(self.cfg.num_layers):
            x = self._block(x, layer, attend)
        return x[0]

    @torch.inference_mode()
    def prefill(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Prefill several sequences in one pass, each from where its cached prefix ends (see `Chunk`), storing
        the new tokens' keys/values; logits of each chunk's last token [len(chunks), V]."""
        device = self.k_cache.device
        ids, positions, rows, index, last = [], [], [], [], []
        for chunk in chunks:
            index += [i + len(ids) for i in chunk.write_index]
            rows += chunk.write_rows
            positions += range(chunk.start, chunk.start + len(chunk.ids))
            ids += chunk.ids
            last.append(len(ids) - 1)
        tensors = [torch.tensor(x, device=device) for x in (ids, positions, rows, index, last)]
        hidden = self._forward(tensors[0], tensors[1], chunks, (tensors[2], tensors[3]))
        return self._logits(hidden[tensors[4]])

    @torch.inference_mode()
    def score(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits [L, V] at every position of ids [L], touching no cache: a function of the weights and
        these tokens only, whatever else the engine is decoding."""
        whole = Chunk(ids=ids.tolist(), start=0, rows=[], write_rows=[], write_index=[])
        return self._logits(self._forward(ids, torch.arange(len(ids), device=ids.device), [whole], None))

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor,
               batch_key: object = None, span: int | None = None) -> torch.Tensor:
        """One token for each of B sequences at its own position, sequence b's blocks listed in
        table[b] (block numbers, in order); logits [B, V].
        Attention reads each sequence's rows up to `span` (default: the longest sequence's length) padded to the
        mirror's width (`mirror.padded_span`), masked per row: from the `DecodeMirror` while the caller's
        `batch_key` (the same sequences, each one position further) is unchanged, else gathered from the blocks.
        With `span` given and no `batch_key` the step reads nothing back to the host: a CUDA graph can hold it
        (`graphs.py`)."""
        b = tokens.shape[0]
        span = int(positions.max()) + 1 if span is None else span
        bs = self.block_size
        width = padded_span(span, table.shape[1] * bs)  # what the mirror holds: both paths multiply the same shapes
        blocks = -(-width // bs)
        offsets = torch.arange(bs, device=tokens.device)
        gather = (table[:, :blocks, None] * bs + offsets).view(b, -1)[:, :width].reshape(-1)  # cache rows [B * T]
        write = table.gather(1, (positions // bs)[:, None])[:, 0] * bs + positions % bs  # [B]
        keys_at = torch.arange(width, device=tokens.device)[None]
        masks = {}  # per attention kind, additive [B, 1, 1, T]: keys up to the position (and within the window)
        for kind in self.inv_freq:
            seen = keys_at <= positions[:, None]
            if kind == "sliding":
                seen &= keys_at > positions[:, None] - self.cfg.sliding_window
            masks[kind] = torch.zeros(seen.shape, dtype=self.k_cache.dtype,
                                      device=tokens.device).masked_fill_(~seen, float("-inf"))[:, None, None]

        rope = self._rope(positions[:, None], self.k_cache.dtype)  # once for all layers
        mirrored = batch_key is not None and self.mirror.ready(batch_key, positions, width, self.k_cache,
                                                               self.v_cache, table, bs, self.cache_bytes())

        def attend(h, layer):
            q, k, v = self._attention_input(h, layer, rope)
            k_layer, v_layer = self.k_cache[layer], self.v_cache[layer]
            k_layer[:, write] = k[:, :, 0].transpose(0, 1)
            v_layer[:, write] = v[:, :, 0].transpose(0, 1)
            mask = masks[self.kinds[layer]]
            if mirrored:
                return decode_attention(q, *self.mirror.append(layer, k[:, :, 0], v[:, :, 0]), mask, self.scale)
            keys = k_layer.index_select(1, gather).view(self.kv_heads, b, width, -1)
            values = v_layer.index_select(1, gather).view(self.kv_heads, b, width, -1)
            # the mirror's layout: keys transposed
            return decode_attention(q, keys.transpose(-1, -2).contiguous(), values, mask, self.scale)

        x = self._embed(tokens)[:, None]
        with self.packed.enabled(b):
            for layer in range(self.cfg.num_layers):
                x = self._block(x, layer, attend)
            return self._logits(x[:, 0], as_float=self.tp_group is not None)  # the sampler converts them

