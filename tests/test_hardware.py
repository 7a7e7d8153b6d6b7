"""What `precision: auto` picks from the CPU, and the instruction-set caps that run an AVX-512/AMX host on an
AVX2-only host's kernels (utils/hardware.py)."""

import pytest
import torch

from rlinf_like.utils import hardware


@pytest.mark.parametrize("env", [{"ONEDNN_MAX_CPU_ISA": "AVX2"}, {"ONEDNN_MAX_CPU_ISA": "avx512_core"},
                                 {"ATEN_CPU_CAPABILITY": "avx2"}, {"ATEN_CPU_CAPABILITY": "default"}])
def test_a_cap_below_the_bf16_units_makes_auto_pick_fp32_and_says_why(monkeypatch, env):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("a CPU", frozenset({"avx2", "fma", "avx512f", "amx_bf16"})))
    for key in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(key, raising=False)
    assert hardware.auto_precision(torch.device("cpu")) == ("bf16", "CPU has amx_bf16")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    precision, why = hardware.auto_precision(torch.device("cpu"))
    assert precision == "fp32" and why == f"{key}={value.upper() if 'ONEDNN' in key else value} rules out the CPU's bf16 units"
    assert hardware.cpu_bf16_units() == [] and hardware.isa_flags().endswith(f"(capped: {key}="
                                                                              f"{value.upper() if 'ONEDNN' in key else value})")


@pytest.mark.parametrize("env", [{"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, {"ONEDNN_MAX_CPU_ISA": "ALL"},
                                 {"ATEN_CPU_CAPABILITY": "avx512"}, {"ONEDNN_MAX_CPU_ISA": "not-a-level"}])
def test_a_cap_that_keeps_the_bf16_units_changes_nothing(monkeypatch, env):
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("a CPU", frozenset({"avx2", "avx512_bf16"})))
    for key in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert hardware.auto_precision(torch.device("cpu"))[0] == "bf16" and hardware.isa_cap() is None
