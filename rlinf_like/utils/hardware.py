"""What this host computes with: the CPU's model and vector units, and the precision `auto` picks from them.

Hosts of one machine kind differ (an AVX2-only EPYC next to a Zen 4 with AVX512_BF16), and so do users' laptops,
so precision is chosen from the flags at run time, never assumed, and every figure names the flags it ran on.
"""

from __future__ import annotations

import os
import platform
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch stays unimported for callers that only describe the machine (bench/run_all.py)
    import torch

# The units that decide which float kernels MKL and oneDNN run, and whether bf16 matmuls are fast.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16")
BF16_UNITS = ("avx512_bf16", "amx_bf16")  # native bf16 dot products (oneDNN's avx512_core_bf16 / amx kernels)


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), flags


def cpu_model() -> str:
    return _cpuinfo()[0]


def isa_flags() -> str:
    """The CPU's flags among `ISA_FLAGS`, space-separated; "unknown" where /proc/cpuinfo is missing."""
    flags = _cpuinfo()[1]
    if not flags:
        return "unknown"
    named = " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + ",".join(ISA_FLAGS)
    cap = isa_cap()
    return f"{named} (capped: {cap})" if cap else named


# oneDNN's ISA levels in order (its ONEDNN_MAX_CPU_ISA values); bf16 dot products start at AVX512_CORE_BF16.
_ONEDNN_ISA = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
               "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
               "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT")
_ATEN_BELOW_AVX512 = ("default", "avx2")


def isa_cap() -> str | None:
    """The cap a user set on the kernels' instruction sets, if it rules out the bf16 units: oneDNN's
    `ONEDNN_MAX_CPU_ISA` below AVX512_CORE_BF16, or ATen's `ATEN_CPU_CAPABILITY` below avx512. Set with
    `MKL_ENABLE_INSTRUCTIONS=AVX2`, these run an AVX-512/AMX host on the kernels of an AVX2-only one."""
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if onednn in _ONEDNN_ISA and _ONEDNN_ISA.index(onednn) < _ONEDNN_ISA.index("AVX512_CORE_BF16"):
        return f"ONEDNN_MAX_CPU_ISA={onednn}"
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if aten in _ATEN_BELOW_AVX512:
        return f"ATEN_CPU_CAPABILITY={aten}"
    return None


def cpu_bf16_units() -> list[str]:
    """The CPU's bf16 units that the kernels may use: none where `isa_cap()` rules them out."""
    if isa_cap():
        return []
    return [f for f in BF16_UNITS if f in _cpuinfo()[1]]


def auto_precision(device: "torch.device") -> tuple[str, str]:
    """(precision, why) for `precision: auto` on `device`: bf16 on a GPU and on a CPU with bf16 units, else fp32
    (without those units bf16 is converted in software and is no faster than fp32)."""
    if device.type == "cuda":
        import torch

        return "bf16", f"GPU {torch.cuda.get_device_name(device)}"
    units = cpu_bf16_units()
    if units:
        return "bf16", f"CPU has {'+'.join(units)}"
    cap = isa_cap()
    if cap:
        return "fp32", f"{cap} rules out the CPU's bf16 units"
    return "fp32", f"CPU has no bf16 units ({isa_flags()})"
