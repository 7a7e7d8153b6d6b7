"""MegatronModelManager: megatron-core GPTModel with TP / PP / DP behind the ModelManager interface.

Runs inside a worker whose default process group is initialized (gloo on CPU, NCCL on GPU). The
model is built from an HF Llama / Qwen2 / Qwen3 model or checkpoint directory and loaded with its weights
through the conversion table; megatron's DDP wrapper (gradients in `param.main_grad`, fp32
reduction) and its optimizer (optionally the distributed optimizer) train it. One
`forward_backward` call runs megatron's schedule over `micro_batches` slices of its batch (the
pipeline schedule when pipeline_parallel > 1); as with FSDP, the caller owns accumulation across
calls and `sync_gradients=False` defers the data-parallel reduction. Losses are the project's
`(model, batch) -> (loss, metrics)` functions: the last stage hands them the gathered logits.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rlinf_like.hybrid_engines.lr_schedule import lr_multiplier
from rlinf_like.hybrid_engines.megatron import convert, cpu_compat, layouts, model as mmodel
from rlinf_like.hybrid_engines.megatron.checkpoint import export_hf, load_checkpoint, save_checkpoint
from rlinf_like.hybrid_engines.megatron.hf_source import hf_source
from rlinf_like.hybrid_engines.megatron.parallel import destroy_parallel, init_parallel
from rlinf_like.hybrid_engines.megatron.types import MegatronConfig
from rlinf_like.hybrid_engines.model_manager import (
    Batch, DataParallelRank, LossFn, ModelManager, token_logprobs, token_nll_loss,
)
from rlinf_like.hybrid_engines.packing import Packing
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.utils.extras import require


log = logging.getLogger(__name__)


def _check_config(cfg: MegatronConfig) -> None:
    for key, value, allowed in (("precision", cfg.precision, ("auto", "bf16", "fp32")),
                                ("layer_spec", cfg.layer_spec, ("auto", "te", "local"))):
        if value not in allowed:
            raise ValueError(f"megatron manager: {key}={value!r} is not one of {list(allowed)}")
    if cfg.layer_spec == "te" and not mmodel.te_available():
        raise ValueError("megatron manager: layer_spec='te' needs transformer_engine and a CUDA device; "
                         "use 'local' or 'auto'")
    if cfg.micro_batches < 1:
        raise ValueError(f"megatron manager: micro_batches={cfg.micro_batches} must be >= 1")


class _OptimizerState:
    """What the residency manager reads from megatron's optimizer: the state of every underlying
    torch optimizer, plus the parameters it steps that are not model parameters (fp32 main copies)."""

    def __init__(self, optimizer, model: nn.Module):
        self.optimizers = [o.optimizer for o in getattr(optimizer, "chained_optimizers", [optimizer])]
        self._model_storages = {p.untyped_storage()._cdata for p in model.parameters()}

    @property
    def state(self) -> dict:
        out = {}
        for opt in self.optimizers:
            out.update(opt.state)
            for group in opt.param_groups:
                for p in group["params"]:
                    if p.untyped_storage()._cdata not in self._model_storages:
                        out[("main", id(p))] = {"main_param": p}
        return out


def _import_megatron() -> None:
    """megatron-core imported in a worker whose process group is up. Without TransformerEngine its import-time
    fallback warnings (~20 lines a run over the ranks) become one log line."""
    quiet = not mmodel.te_available()
    if quiet:
        cpu_compat.quiet_fallback_warnings()  # before megatron.core's first import, which warns
    require("megatron.core")
    if not dist.is_initialized():
        raise RuntimeError("MegatronModelManager needs an initialized process group (launch it inside a Worker)")
    if quiet and dist.get_rank() == 0:
        log.info("megatron-core runs without TransformerEngine: torch's norms, optimizer and grad clipping")


class MegatronModelManager(ModelManager):
    def __init__(self, source: nn.Module | str | Path, config: MegatronConfig | None = None):
        _import_megatron()
        from megatron.core import parallel_state as ps
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        self.config = cfg = config or MegatronConfig()
        _check_config(cfg)
        self.hf_config, hf_weights = hf_source(source)
        self.model_cfg = mc = mmodel.model_config(self.hf_config)
        mmodel.check_parallel(mc, cfg.tensor_parallel, cfg.pipeline_parallel)
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        self.te_spec = cfg.layer_spec == "te" or (cfg.layer_spec == "auto" and mmodel.te_available())
        tp, pp = cfg.tensor_parallel, cfg.pipeline_parallel
        self.tconfig = mmodel.transformer_config(self.hf_config, tp, pp, self.dtype)
        init_parallel(tp, pp, cfg.seed)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.tp_rank, self.pp_rank = ps.get_tensor_model_parallel_rank(), ps.get_pipeline_model_parallel_rank()
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        coords: list[Any] = [None] * self.world_size
        dist.all_gather_object(coords, layouts.RankCoord(self.tp_rank, self.pp_rank))
        self.coords = coords
        self.rules = convert.rules_for(mc.family, self.te_spec)
        self.heads = convert.Heads(mc.num_heads, mc.num_kv_heads, mc.head_dim)

        with cpu_compat.cuda_as_cpu():  # tied embeddings across stages: megatron moves them with .cuda()
            self.gpt = mmodel.build_stage(self.tconfig, self.hf_config, self.te_spec, ps.is_pipeline_first_stage(),
                                          ps.is_pipeline_last_stage())
        self.layer_offset = layouts.stage_layers(mc.num_layers, pp, self.pp_rank).start
        self._load_hf(hf_weights)
        # One dtype for every parameter, as megatron's Float16Module does: without TE or Apex its torch norms are
        # built in fp32 whatever params_dtype says (seen on the first GPU run), and the sync plan names one dtype.
        self.gpt.to(self.device, self.dtype)
        with cpu_compat.cuda_as_cpu():
            self.ddp = DistributedDataParallel(
                self.tconfig,
                DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=cfg.distributed_optimizer),
                self.gpt,
            )
            o = cfg.optim
            self.optimizer = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", lr=o.lr, weight_decay=o.weight_decay, adam_beta1=o.betas[0],
                                adam_beta2=o.betas[1], adam_eps=o.eps, bf16=bf16, params_dtype=self.dtype,
                                clip_grad=o.clip_grad if o.clip_grad is not None else math.inf,
                                use_distributed_optimizer=cfg.distributed_optimizer),
                [self.ddp],
            )
        self.model = mmodel.LogitsModule(self.ddp)
        self._lr = lr_multiplier(cfg.scheduler)
        self.base_lr = cfg.optim.lr  # set_base_lr changes it (SFT warm-start, then RL)
        self.step = 0
        self._set_lr()
        self.residency = ResidencyManager(self.model, _OptimizerState(self.optimizer, self.model))

    def _load_hf(self, hf: Mapping[str, torch.Tensor]) -> None:
        output, embedding = self.model_cfg.family.tied
        with torch.no_grad():
            for name, param in self.gpt.named_parameters():
                found = convert.match(self.rules, name)
                if found is None:
                    raise KeyError(f"megatron parameter {name!r} has no conversion rule")
                rule, layer = found
                if rule.hf == (output,) and self.model_cfg.tie_word_embeddings:
                    rule = next(r for r in self.rules if r.hf == (embedding,))  # megatron's copy of the embedding
                layer = None if layer is None else layer + self.layer_offset
                param.copy_(convert.hf_to_megatron(rule, layer, hf, self.heads, self.tp_rank,
                                                   self.config.tensor_parallel))

    def _set_lr(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self._lr(self.step)

    def set_base_lr(self, lr: float) -> None:
        """Every param group of megatron's optimizer (decay / no-decay, chained) takes the same LR."""
        self.base_lr = lr
        self._set_lr()

    def data_parallel(self) -> DataParallelRank:
        """The ranks of one TP x PP replica train on the same rows; its first rank reports them (in
        megatron's rank order tp-dp-pp, replicas' first ranks come in data-parallel order)."""
        return DataParallelRank(self.dp_rank, self.dp_size, self.tp_rank == 0 and self.pp_rank == 0)

    def close(self) -> None:
        """Tear down megatron's parallel state so another manager (another layout) can start here."""
        destroy_parallel()

    # --- training ---------------------------------------------------------------------------------
    def _micro_batches(self, batch: Batch) -> list[dict[str, torch.Tensor]]:
        n, rows = self.config.micro_batches, batch["input_ids"].shape[0]
        if rows % n:
            raise ValueError(f"megatron manager: micro_batches={n} must divide the batch's {rows} rows")
        per = rows // n
        micro = [{k: v[i * per:(i + 1) * per].to(self.device) if isinstance(v, torch.Tensor) else v
                  for k, v in batch.items()} for i in range(n)]
        packing = batch.get("packing")
        if packing is not None:  # each slice is packed on its own
            if self.config.pipeline_parallel > 1 or self.te_spec:
                raise ValueError("megatron manager: packed batches need pipeline_parallel=1 and the local layer "
                                 "spec (stages would exchange varying shapes; TE would need PackedSeqParams)")
            for mb in micro:
                mb["packing"] = Packing.plan(mb["input_ids"], mb.get("attention_mask"), packing.max_batch_seqlen)
        return micro

    def _run(self, batch: Batch, loss_of, forward_only: bool) -> list[dict]:
        """Megatron's schedule over the micro-batches; returns the last stage's per-micro-batch outputs."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        micro = self._micro_batches(batch)

        def forward_step(data_iterator, model):
            mb = next(data_iterator)
            packing = mb.get("packing")
            if packing is None:
                output = self.model(mb["input_ids"], mb.get("attention_mask"))
            else:  # the loss functions see the packed logits through FixedOutput and unpack them
                output = self.model(packing.input_ids, position_ids=packing.position_ids)
            return output, partial(loss_of, mb)

        rows, seq = micro[0]["input_ids"].shape
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro), model=[self.ddp],
            num_microbatches=len(micro), seq_length=seq, micro_batch_size=rows, forward_only=forward_only,
        )

    def _from_last_stage(self, value: Any) -> Any:
        """Every pipeline stage gets what the last stage computed."""
        from megatron.core import parallel_state as ps

        if self.config.pipeline_parallel == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=ps.get_pipeline_model_parallel_last_rank(),
                                   group=ps.get_pipeline_model_parallel_group())
        return box[0]

    def forward_backward(
        self, batch: Batch, loss_fn: LossFn | None = None, *, loss_scale: float = 1.0, sync_gradients: bool = True
    ) -> dict[str, float]:
        from megatron.core.distributed import finalize_model_grads

        loss_fn = loss_fn or token_nll_loss

        def loss_of(mb, logits):
            loss, metrics = loss_fn(mmodel.FixedOutput(logits), mb)
            return loss * loss_scale, {"loss": loss.item(), **metrics}

        self.ddp.train()
        # without finalize, gradients stay local in the grad buffer: the next synced call reduces them
        self.tconfig.finalize_model_grads_func = finalize_model_grads if sync_gradients else None
        self.tconfig.no_sync_func = self.ddp.no_sync
        with cpu_compat.cuda_as_cpu():
            outputs = self._run(batch, loss_of, forward_only=False)
        metrics = {k: sum(o[k] for o in outputs) / len(outputs) for k in outputs[0]} if outputs else None
        return self._from_last_stage(metrics)

    def optim_step(self) -> dict[str, float]:
        lr = self.optimizer.param_groups[0]["lr"]
        with cpu_compat.cuda_as_cpu():
            self.optimizer.prepare_grads()
            norm = float(self.optimizer.get_grad_norm())
            skipped = not math.isfinite(norm)
            if not skipped:  # a NaN/inf gradient never reaches the weights
                self.optimizer.step()
                self.step += 1
                self._set_lr()
            self.clear_gradients()
        return {"grad_norm": norm, "lr": lr, "skipped": float(skipped)}

    def clear_gradients(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
        def logprobs_of(mb, logits):
            lp = token_logprobs(mmodel.FixedOutput(logits), mb, temperature)
            return lp.sum() * 0, {"logprobs": lp.cpu()}

        self.ddp.eval()
        with cpu_compat.cuda_as_cpu():
            outputs = self._run(batch, logprobs_of, forward_only=True)
        out = torch.cat([o["logprobs"] for o in outputs]) if outputs else None
        return self._from_last_stage(out)

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        save_checkpoint(self, path)

    def load(self, path: str) -> None:
        load_checkpoint(self, path)

    def export_hf(self, path: str) -> None:
        export_hf(self, path)

    # --- weight sync, introspection ---------------------------------------------------------------
    def named_shards(self) -> dict[str, torch.Tensor]:
        """This rank's shards under HF names (q/k/v and gate/up split out of the fused tensors)."""
        return layouts.hf_named_shards(self.gpt.named_parameters(), self.rules, self.heads,
                                       self.config.tensor_parallel, self.layer_offset, self.model_cfg)

    def shard_layouts(self) -> list[TensorLayout]:
        return layouts.hf_layouts(self.model_cfg, self.rules, self.coords, self.config.tensor_parallel,
                                  self.config.pipeline_parallel, self.dtype)

    def get_config(self) -> dict[str, Any]:
        # the resolved layer spec last: the config's own `layer_spec` may say "auto"
        return {**asdict(self.config), "backend": "megatron", "world_size": self.world_size,
                "device": str(self.device), "data_parallel": self.dp_size,
                "layer_spec": "te" if self.te_spec else "local", "dtype": str(self.dtype)}
