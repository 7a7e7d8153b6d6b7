"""A Vulkan driver for SAPIEN (ManiSkill3) on machines without a GPU.

SAPIEN creates a Vulkan render system for every ManiSkill task, state observations included (PickCube
builds render materials), and Debian 12's Mesa 22.3 lavapipe is too old for it (`ErrorIncompatibleDriver`).
`scripts/install_maniskill.sh` unpacks lavapipe from a newer Mesa (bookworm-backports) into
`<venv>/share/lavapipe/` with an ICD file naming its absolute path; `use_lavapipe` points the Vulkan loader
at it, unless the user chose a driver (VK_ICD_FILENAMES / VK_DRIVER_FILES) or an NVIDIA GPU is present.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

INSTALL_HINT = "bash scripts/install_maniskill.sh (mani-skill + a CPU Vulkan driver, lavapipe from Mesa >= 24.3)"


def lavapipe_icd() -> Path:
    return Path(os.environ.get("RLINF_LIKE_LAVAPIPE", Path(sys.prefix) / "share" / "lavapipe")) / "lvp_icd.json"


def use_lavapipe() -> str | None:
    """Point the Vulkan loader at the unpacked lavapipe (before SAPIEN makes its first render system);
    returns the ICD file used, or None when another driver is in charge or none is installed."""
    if os.environ.get("VK_ICD_FILENAMES") or os.environ.get("VK_DRIVER_FILES") or shutil.which("nvidia-smi"):
        return None
    icd = lavapipe_icd()
    if not icd.is_file():
        return None
    os.environ["VK_ICD_FILENAMES"] = str(icd)
    return str(icd)


def no_vulkan_message(err: Exception) -> str:
    icd = lavapipe_icd()
    found = f"lavapipe ICD {icd} present" if icd.is_file() else f"no lavapipe ICD at {icd}"
    return (f"SAPIEN found no usable Vulkan driver ({err}; {found}, VK_ICD_FILENAMES="
            f"{os.environ.get('VK_ICD_FILENAMES')!r}); install one: {INSTALL_HINT}")
