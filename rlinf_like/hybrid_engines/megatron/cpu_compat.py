"""CPU bridge for megatron-core 0.16 (the one place that stands in for CUDA; applied only without CUDA).

megatron-core assumes a GPU in a few places that matter on a CPU test bed. We bridge them here,
never by editing or vendoring megatron-core:

1. Process-wide, once (`apply()`): `torch.cuda.current_device()` returns the CPU device (megatron
   allocates its buffers on it in ~30 places); the "CUDA" RNG that megatron's model-parallel RNG
   tracker forks is the CPU generator (`torch.cuda.manual_seed` / `get_rng_state` and megatron's
   `_get_cuda_rng_state` / `_set_cuda_rng_state`); stream and cache calls are no-ops.
2. Scoped (`cuda_as_cpu()`): a TorchFunctionMode around megatron's model construction (tied embeddings
   across pipeline stages call `.cuda()`), DDP wrapper, optimizer, schedules and checkpointing, which
   create tensors with a hard-coded `device="cuda"`, call `.cuda()`, and check
   `param.type() == "torch.cuda.FloatTensor"`. Inside the mode such devices become the CPU and
   `type()` names a CPU tensor as its CUDA twin. Outside the mode torch behaves normally.

The causal attention mask megatron builds with `device="cuda"` is avoided by always passing an
explicit mask (see model.py). Fusion flags must be off and sequence parallelism needs TE (GPU).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_applied = False
CPU = torch.device("cpu")


class _NullStream:
    """Stands in for torch.cuda.Stream: work on CPU is synchronous."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return None


def _cpu_rng_state(device=None, clone=True, graph_safe=False) -> torch.Tensor:
    return torch.get_rng_state()


def _set_cpu_rng_state(new_state: torch.Tensor, device=-1, graph_safe=False) -> None:
    torch.set_rng_state(new_state)


# what megatron-core warns about, once per module and rank, when it imports without TransformerEngine or Apex
_FALLBACK_WARNINGS = r"(Transformer Engine and Apex are not installed|Apex is not installed)"


def quiet_fallback_warnings() -> None:
    """Without TransformerEngine and Apex (any CPU host), megatron-core warns at import of each module that falls
    back to torch (norms, optimizers, grad clipping): ~20 lines a run across ranks. The manager logs it once
    instead (`MegatronModelManager`), so these are silenced; megatron's other warnings still show."""
    warnings.filterwarnings("ignore", message=_FALLBACK_WARNINGS, category=UserWarning, module=r"megatron\.")


def needed() -> bool:
    return not torch.cuda.is_available()


def apply() -> None:
    """Install the process-wide stand-ins (idempotent; does nothing when CUDA is available)."""
    global _applied
    if _applied or not needed():
        return
    from megatron.core.tensor_parallel import random as mp_random

    torch.cuda.current_device = lambda: CPU
    # the CPU generator directly: torch.manual_seed itself calls torch.cuda.manual_seed_all
    torch.cuda.manual_seed = lambda seed: torch.default_generator.manual_seed(int(seed))
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.set_rng_state = lambda state, device="cuda": torch.set_rng_state(state)
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.Stream = _NullStream
    torch.cuda.current_stream = lambda device=None: _NullStream()
    torch.cuda.default_stream = lambda device=None: _NullStream()
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    mp_random._get_cuda_rng_state = _cpu_rng_state
    mp_random._set_cuda_rng_state = _set_cpu_rng_state
    _applied = True


def _is_cuda(device) -> bool:
    if isinstance(device, int):
        return True  # a bare index means a CUDA device
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaAsCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.cuda,):
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        if _is_cuda(kwargs.get("device")):
            kwargs["device"] = CPU
        if func is torch.Tensor.to and args and len(args) > 1 and _is_cuda(args[1]):
            args = (args[0], CPU, *args[2:])
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_as_cpu() -> Iterator[None]:
    """Run megatron's DDP / optimizer code on CPU tensors (a no-op when CUDA is available)."""
    if not needed():
        yield
        return
    apply()
    with _CudaAsCpu():
        yield
