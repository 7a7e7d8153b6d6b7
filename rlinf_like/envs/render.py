"""Offscreen OpenGL for MuJoCo on CPU. MuJoCo picks its GL backend from MUJOCO_GL when it is first
imported, so `ensure_gl()` must run before that: it keeps a user's choice, else takes OSMesa when
libOSMesa is installed (scripts/setup.sh installs it on Debian), else EGL."""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys


def ensure_gl() -> str:
    if "MUJOCO_GL" not in os.environ:
        os.environ["MUJOCO_GL"] = "osmesa" if ctypes.util.find_library("OSMesa") else "egl"
    if os.environ["MUJOCO_GL"] in ("osmesa", "egl"):
        os.environ.setdefault("PYOPENGL_PLATFORM", os.environ["MUJOCO_GL"])
    return os.environ["MUJOCO_GL"]


_PROBE = """
import mujoco
m = mujoco.MjModel.from_xml_string('<mujoco><worldbody><geom type="sphere" size=".1"/></worldbody></mujoco>')
d = mujoco.MjData(m); r = mujoco.Renderer(m, 16, 16); r.update_scene(d); assert r.render().shape == (16, 16, 3)
"""


def rendering_available() -> tuple[bool, str]:
    """Whether an offscreen MuJoCo render works here (probed in a subprocess: a broken GL can abort),
    and why not."""
    env = {**os.environ, "MUJOCO_GL": ensure_gl()}
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        return False, f"render probe failed: {err}"
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return False, f"MuJoCo offscreen rendering with MUJOCO_GL={env['MUJOCO_GL']} failed ({tail}); " \
                      "install libosmesa6 (scripts/setup.sh does on Debian)"
    return True, ""
