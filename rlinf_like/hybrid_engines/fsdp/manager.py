"""FSDPModelManager: FSDP2 (`fully_shard`) over a data-parallel mesh of the worker group.

Runs inside a worker whose default process group is initialized (gloo on CPU, NCCL on GPU).
Every nn.ModuleList item (e.g. HF decoder layers) becomes its own FSDP unit, then the root.
Precision `auto` is bf16 on a GPU and on a CPU with bf16 units (AVX512_BF16, AMX), fp32 elsewhere
(`utils/hardware.py`); fp16 on request, with a gradient scaler (`hybrid_engines/grad_scaling.py`). bf16 keeps
fp32 master weights, gradients and optimizer state: on GPU FSDP's mixed-precision policy casts the weights for
compute and reduces gradients in fp32; on CPU the forward runs under `torch.autocast` (measured on a Zen 4 host,
SmolLM2 forward+backward on 8 x 128 tokens: autocast 3.67 s, pure bf16 weights 3.43 s, fp32 9.41 s; and an update
smaller than a bf16 weight's ulp is not lost).

On one rank in fp32 there is nothing to shard or reduce, so the model stays a plain module (no
DTensors, no FSDP hooks, no collectives per step): same math, and for a small MLP a third of the
cost per optimizer step (DTensor dispatch in Adam and in FSDP's backward hooks dominated it).
On GPU, bf16/fp16 keep the FSDP wrapping even on one rank, since its mixed-precision policy does the casting;
so does an explicit `mesh` (the elastic actor).

With `config.lora.rank > 0` the model is first wrapped by peft (`fsdp/lora.py`): the optimizer holds only
the adapters, the frozen base has no gradients or optimizer state (so offload moves base weights and
adapter state only), checkpoints hold the adapters and their optimizer state (plus the base model's
path), and the weight sync and HF export carry merged weights under the base model's names.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from rlinf_like.hybrid_engines import cpu_attention, grad_scaling
from rlinf_like.hybrid_engines.fsdp import lora
from rlinf_like.hybrid_engines.fsdp.cast_window import CastWindow
from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig
from rlinf_like.hybrid_engines.lora_sync import AdapterSpec
from rlinf_like.hybrid_engines.lr_schedule import SchedulerConfig, lr_multiplier
from rlinf_like.hybrid_engines.model_manager import (
    Batch,
    LossFn,
    ModelManager,
    OptimConfig,
    swap_checkpoint_into_place,
    token_logprobs,
    token_nll_loss,
)
from rlinf_like.hybrid_engines.packing import Packing
from rlinf_like.hybrid_engines.prompt_sharing import SharedPrompts
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout, replicated
from rlinf_like.hybrid_engines.reshard.sync import dtensor_layout
from rlinf_like.hybrid_engines.residency import PARTS, MoveStats, ResidencyManager
from rlinf_like.utils import hardware


@dataclass
class FSDPConfig:
    # auto: bf16 on a GPU or a CPU with bf16 units, else fp32 (utils/hardware.py); fp16: with a gradient scaler.
    # fp32 unless asked: the runners pass their actor.precision, whose default is auto
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "fp32"
    activation_checkpointing: bool = False
    reshard_after_forward: bool = True
    # Sharded: trade speed for memory (the launcher sets it for a model the default memory share cannot hold):
    # gather the weights per micro-batch instead of holding them over a step (CPU), and reduce-scatter the gradients
    # of every micro-batch instead of accumulating unsharded ones (on Gemma 3 270M it saved 0.3-0.6 GB a rank, less
    # than the two unsharded copies of the weights it avoids, and cost ~30% of the step: docs/benchmarks/training-step.md)
    lean: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)  # rank 0: full fine-tuning


log = logging.getLogger(__name__)
LORA_STATE = "lora.json"
ADAPTER_DIR = "adapter"  # under an export: the adapters in peft's own format  # in a LoRA checkpoint: the adapter config and the base model's path


def _is_hf(model: nn.Module) -> bool:
    return hasattr(model, "config") and hasattr(model.config, "model_type") and hasattr(model, "save_pretrained")


def _blocks(model: nn.Module) -> list[nn.Module]:
    return [block for module in model.modules() if isinstance(module, nn.ModuleList) for block in module]


class FSDPModelManager(ModelManager):
    def __init__(self, model: nn.Module, config: FSDPConfig | None = None, mesh: DeviceMesh | None = None):
        """`mesh`: the data-parallel mesh to shard over (default: the whole worker group). A one-rank
        mesh makes every rank hold the whole model and reduce no gradients: the elastic actor
        (`workers/actor/elastic.py`) reduces them itself over the ranks active at that step."""
        if not dist.is_initialized():
            raise RuntimeError("FSDPModelManager needs an initialized process group (launch it inside a Worker)")
        self.config = config or FSDPConfig()
        self.device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_hf = _is_hf(model)

        if self.config.activation_checkpointing:
            if not self.is_hf:
                raise ValueError("activation_checkpointing is supported for HF models (gradient_checkpointing_enable)")
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lora = self.config.lora if self.config.lora.enabled else None
        self.base_path = str(getattr(model, "name_or_path", "") or "")  # HF models: the folder they came from
        if self.lora is not None:
            lora.check_lora(self.lora)
            model = lora.wrap(model, self.lora)
        model.to(self.device)
        self.precision = precision = self._resolve_precision()
        on_gpu = self.device.type == "cuda"
        # CPU bf16: fp32 weights, the forward under autocast (see the module docstring)
        self.autocast = precision == "bf16" and not on_gpu
        if self.autocast and self.is_hf:  # short sequences' attention in float32 (cpu_attention.py: 1.5-10x faster)
            cpu_attention.install()
        # else a plain module (see the module docstring)
        self.sharded = mesh is not None or self.world_size > 1 or (precision != "fp32" and not self.autocast)
        # On CPU, gloo's all-gathers go over loopback TCP: a step's micro-batches keep the weights gathered from the
        # first forward to the last backward instead of gathering them twice per micro-batch (measured on SmolLM2,
        # 2 ranks, 12 micro-batches: train 62-68 s -> 38-41 s per GRPO step); the extra memory is one rank's
        # unsharded weights
        self.hold_gathered = self.sharded and self.device.type == "cpu" and not self.config.lean
        self.mesh = None
        if self.sharded:
            self.mesh = mesh if mesh is not None else init_device_mesh(self.device.type, (self.world_size,))
            shard_kwargs: dict[str, Any] = dict(mesh=self.mesh, reshard_after_forward=self.config.reshard_after_forward)
            if precision in ("bf16", "fp16") and not self.autocast:  # fp32 masters, low-precision compute, fp32 reduce
                compute = torch.bfloat16 if precision == "bf16" else torch.float16
                shard_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
            for block in _blocks(model):
                fully_shard(block, **shard_kwargs)
            fully_shard(model, **shard_kwargs)
        self.model = model
        self._casts = CastWindow(self.autocast and not self.config.lean)

        o = self.config.optim
        # under LoRA only the adapters: gradients and Adam state are adapter-sized
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=o.lr, betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay,
            foreach=None if self.sharded else True,  # plain CPU tensors: one foreach kernel per op, not one per tensor
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_multiplier(self.config.scheduler))
        self.residency = ResidencyManager(model, self.optimizer)
        self.scaler = grad_scaling.make_grad_scaler(precision, self.device)  # fp16 only
        self.step = 0
        # under LoRA: the base model's tensors LoRA changes (what a sync after the first must send)
        self._changed = lora.adapter_sync_names(dict(model.named_parameters())) if self.lora is not None else None

    def _resolve_precision(self) -> str:
        """The config's precision, `auto` resolved for this device (logged once, by rank 0)."""
        precision = self.config.precision
        if precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"FSDPConfig.precision={precision!r} is not one of ['auto', 'bf16', 'fp16', 'fp32']")
        why = "set in the config"
        if precision == "auto":
            precision, why = hardware.auto_precision(self.device)
        if self.rank == 0:
            log.info(f"actor precision {precision} ({why})")
        return precision

    # --- training ---------------------------------------------------------------------------------
    def _to_device(self, batch: Batch) -> dict[str, torch.Tensor]:
        return {k: v.to(self.device) if isinstance(v, (torch.Tensor, Packing, SharedPrompts)) else v
                for k, v in batch.items()}

    def forward_backward(
        self, batch: Batch, loss_fn: LossFn | None = None, *, loss_scale: float = 1.0, sync_gradients: bool = True
    ) -> dict[str, float]:
        if not self.model.training:  # train() walks every submodule: only when eval() was set
            self.model.train()
        # Non-last micro-batches accumulate unsharded gradients locally; the last one reduce-scatters (lean: each one
        # does, into the sharded gradients).
        if self.sharded:
            sync_gradients = sync_gradients or self.config.lean
            self.model.set_requires_gradient_sync(sync_gradients)
            if self.hold_gathered:  # the weights stay gathered from this forward until the step's last backward
                self.model.set_reshard_after_forward(False)
                self.model.set_reshard_after_backward(sync_gradients)
        if sync_gradients and self.sharded:
            self._casts.close()  # the micro-batch that reduce-scatters casts afresh (cast_window.py)
        try:
            with self._compute():
                loss, metrics = (loss_fn or token_nll_loss)(self.model, self._to_device(batch))
            grad_scaling.backward(loss * loss_scale, self.scaler)
        finally:
            if self.hold_gathered:
                self.model.set_reshard_after_forward(self.config.reshard_after_forward)
        return {"loss": loss.item(), **metrics}

    def accumulating(self) -> contextlib.AbstractContextManager:
        """CPU bf16 (not lean, whose copies would outlive the per-micro-batch gather): the weights cast once a step
        (`cast_window.py`)."""
        return self._casts.around_step()

    def _reshard(self) -> None:
        """Free gathered weights a step left whole (an accumulation cut short): whatever reads parameters next
        (a forward-only pass, a checkpoint, a weight sync) sees the sharded ones."""
        if self.hold_gathered:
            for module in self.model.modules():
                if isinstance(module, FSDPModule):
                    module.reshard()

    def optim_step(self) -> dict[str, float]:
        self._reshard()
        params = [p for p in self.model.parameters() if p.grad is not None]  # frozen base weights have none
        max_norm = self.config.optim.clip_grad if self.config.optim.clip_grad is not None else float("inf")
        lr = self.optimizer.param_groups[0]["lr"]
        # a NaN/inf gradient never reaches the weights (under fp16 the scaler then lowers its scale)
        norm, skipped = grad_scaling.optimizer_step(self.optimizer, params, max_norm, self.scaler)
        if not skipped:
            self.scheduler.step()
            self.step += 1
        self.optimizer.zero_grad(set_to_none=True)
        scale = {"grad_scale": float(self.scaler.get_scale())} if self.scaler is not None else {}
        return {"grad_norm": norm, "lr": lr, "skipped": float(skipped), **scale}

    def clear_gradients(self) -> None:
        self._reshard()
        self.optimizer.zero_grad(set_to_none=True)

    def set_base_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
            group["lr"] = lr * self.scheduler.lr_lambdas[0](self.scheduler.last_epoch)
        self.scheduler.base_lrs = [lr] * len(self.optimizer.param_groups)

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
        self._reshard()
        self.model.eval()
        with self._compute():
            return token_logprobs(self.model, self._to_device(batch), temperature).cpu()

    def _compute(self) -> contextlib.AbstractContextManager:
        """The forward's precision context: CPU bf16 runs under autocast, everything else as the weights are."""
        return torch.autocast("cpu", dtype=torch.bfloat16) if self.autocast else contextlib.nullcontext()

    def adapters_disabled(self) -> contextlib.AbstractContextManager:
        """Under LoRA: the frozen base model inside the context (peft's `disable_adapter`), e.g. the KL
        reference without a second model. Without LoRA there is nothing to disable: refused."""
        if self.lora is None:
            raise RuntimeError("adapters_disabled needs LoRA (actor.lora.rank > 0)")
        return self.model.disable_adapter()

    def offload(self, parts=PARTS) -> list[MoveStats]:
        self._reshard()  # the residency manager moves the sharded storages
        return super().offload(parts)

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Sharded checkpoint of model, optimizer, scheduler, step and RNG; written to `path.tmp` and
        renamed into place, so an interrupted save never destroys the previous checkpoint (it stays
        under `path`, or under `path.old` during the swap)."""
        self._reshard()
        final, tmp = Path(path), Path(f"{path}.tmp")
        if self.rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
        dist.barrier()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._state_options())
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
        if self.lora is not None and self.rank == 0:
            (tmp / LORA_STATE).write_text(json.dumps({"lora": asdict(self.lora), "base_model": self.base_path}))
        extra = {
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
        }
        torch.save(extra, tmp / f"extra_rank{self.rank}.pt")
        dist.barrier()
        if self.rank == 0:
            swap_checkpoint_into_place(tmp, final)
        dist.barrier()

    def _state_options(self) -> StateDictOptions | None:
        """Under LoRA a checkpoint holds the trainable tensors only (the adapters): the base is its path."""
        return StateDictOptions(ignore_frozen_params=True) if self.lora is not None else None

    def _check_lora_checkpoint(self, path: Path) -> None:
        saved = json.loads((path / LORA_STATE).read_text()) if (path / LORA_STATE).exists() else None
        if (saved is None) != (self.lora is None):
            raise ValueError(f"checkpoint {path} was written {'with' if saved else 'without'} LoRA, this actor runs "
                             f"{'with' if self.lora else 'without'} it (actor.lora.rank)")
        if saved is None:
            return
        differ = {k: (v, getattr(self.lora, k)) for k, v in saved["lora"].items() if getattr(self.lora, k) != v}
        if differ:
            raise ValueError("checkpoint " + str(path) + " has other adapters: " + ", ".join(
                f"actor.lora.{k}={now!r} (saved {was!r})" for k, (was, now) in differ.items()))
        if saved["base_model"] != self.base_path:
            log.warning(f"LoRA checkpoint {path} was trained on base model {saved['base_model']!r}; "
                        f"loading its adapters onto {self.base_path!r}")

    def load(self, path: str) -> None:
        self._reshard()
        self._check_lora_checkpoint(Path(path))
        options = self._state_options()
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=options)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(Path(path) / "dcp"))
        if options is not None:  # LoRA: the frozen base is not in the checkpoint (dcp.load found every adapter)
            options = StateDictOptions(ignore_frozen_params=True, strict=False)
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=options)
        extra = torch.load(Path(path) / f"extra_rank{self.rank}.pt", weights_only=False)
        self.scheduler.load_state_dict(extra["scheduler"])
        self.step = extra["step"]
        if self.scaler is not None and extra.get("scaler"):
            self.scaler.load_state_dict(extra["scaler"])
        torch.set_rng_state(extra["rng"]["torch"])
        random.setstate(extra["rng"]["python"])
        np.random.set_state(extra["rng"]["numpy"])

    def export_hf(self, path: str) -> None:
        """Full weights to `path` as safetensors (with config.json for HF models), written by rank 0. Under
        LoRA: the merged model there, and the adapters in peft's format in `path/adapter`
        (`peft.PeftModel.from_pretrained(base, path/adapter)` loads them)."""
        self._reshard()
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0 and self.lora is not None:
            Path(path).mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(Path(path) / ADAPTER_DIR), state_dict=full, safe_serialization=True)
            self.model.get_base_model().save_pretrained(path, state_dict=lora.merged_full(full, self.lora.scaling),
                                                        safe_serialization=True)
        elif self.rank == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
            if self.is_hf:
                self.model.save_pretrained(path, state_dict=full, safe_serialization=True)
            else:
                from safetensors.torch import save_file

                save_file({k: v.contiguous() for k, v in full.items()}, str(Path(path) / "model.safetensors"))
        dist.barrier()

    def adapter_weights(self) -> dict[str, torch.Tensor] | None:
        """Under LoRA, the adapters whole under their sync names (`lora.sync_name`), at rank 0; None on the other
        ranks: what an engine holding the base weights needs to serve the trained model. Only the adapters are
        gathered (every rank takes part), not the frozen base."""
        self._reshard()
        whole = {lora.sync_name(n): (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu()
                 for n, p in self.model.named_parameters() if lora.is_adapter(n)}
        return whole if self.rank == 0 else None

    # --- weight sync, introspection ---------------------------------------------------------------
    def named_shards(self) -> dict[str, torch.Tensor]:
        """What a weight sync sends: this rank's parameters; under LoRA the base model's (unmerged, base names)
        and the adapters (`lora_sync.adapter_names`): the rollout merges them (see `adapter_spec`)."""
        self._reshard()
        named = dict(self.model.named_parameters())
        return lora.sync_names(named) if self.lora is not None else named

    def shard_layouts(self) -> list[TensorLayout]:
        self._reshard()
        named = list(self.model.named_parameters())
        if self.lora is not None:
            named = list(lora.sync_names(dict(named)).items())
        if not self.sharded:  # one rank holds every tensor whole
            return [replicated(name, tuple(p.shape), 1, str(p.dtype)) for name, p in named]
        return [dtensor_layout(name, p) for name, p in named]

    def changing_tensors(self) -> list[str] | None:
        """The synced tensors a training step can change, when that is fewer than all (None): under LoRA the
        adapters, so a sync after the first sends only those."""
        return self._changed

    def adapter_spec(self) -> AdapterSpec | None:
        """Under LoRA: what the rollout needs to merge the adapters it receives."""
        if self.lora is None:
            return None
        return AdapterSpec(rank=self.lora.rank, scaling=self.lora.scaling,
                           targets=tuple(sorted(lora.base_name(n) for n in lora.targets(dict(self.model.named_parameters())))))

    def get_config(self) -> dict[str, Any]:
        return {"backend": "fsdp2" if self.sharded else "plain", "world_size": self.world_size,
                "compute_precision": self.precision,
                "device": str(self.device), **asdict(self.config),
                "trainable_params": sum(p.numel() for g in self.optimizer.param_groups for p in g["params"])}
