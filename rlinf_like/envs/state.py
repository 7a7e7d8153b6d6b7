"""Saving and restoring one simulator's state, for env checkpoints (`VectorEnv.get_state`).

MuJoCo: `mj_getState` with `mjSTATE_INTEGRATION` (time, qpos, qvel, act, controls, mocap poses,
the solver's warm start: everything `mj_step` reads), so a restored sim steps bit-exactly.
Gymnasium envs: MuJoCo ones pickle by re-running their constructor (gymnasium's EzPickle) and would
come back fresh, so instead we save the physics, the env's RNG, and the plain attributes (numbers,
arrays: CartPole's `state`, Reacher's `goal`, TimeLimit's `_elapsed_steps`) of the env and each of
its wrappers. State held in other kinds of attributes (lists, objects) is not captured.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

_PLAIN = (bool, int, float, str, np.ndarray, np.generic, type(None))


def physics_state(model, data) -> np.ndarray:
    import mujoco

    spec = mujoco.mjtState.mjSTATE_INTEGRATION
    out = np.empty(mujoco.mj_stateSize(model, spec))
    mujoco.mj_getState(model, data, out, spec)
    return out


def set_physics_state(model, data, state: np.ndarray) -> None:
    import mujoco

    # a copy: arrays that came through Ray's object store are read-only, and mj_setState wants writeable
    state = np.array(state, dtype=np.float64, copy=True)
    mujoco.mj_setState(model, data, state, mujoco.mjtState.mjSTATE_INTEGRATION)
    mujoco.mj_forward(model, data)  # derived quantities (positions of bodies, sensors) for observations


def rng_state(rng: np.random.Generator) -> dict:
    return copy.deepcopy(rng.bit_generator.state)


def _plain(obj: Any) -> dict[str, Any]:
    return {k: copy.deepcopy(v) for k, v in vars(obj).items() if isinstance(v, _PLAIN)}


def _chain(env) -> list:
    """The wrappers from the outside in, then the unwrapped env."""
    out = [env]
    while hasattr(out[-1], "env"):
        out.append(out[-1].env)
    return out


def gym_env_state(env) -> dict:
    inner = env.unwrapped
    state = {"layers": [_plain(layer) for layer in _chain(env)], "rng": rng_state(inner.np_random)}
    if hasattr(inner, "model") and hasattr(inner, "data"):  # gymnasium's MujocoEnv
        state["physics"] = physics_state(inner.model, inner.data)
    return state


def set_gym_env_state(env, state: dict) -> None:
    layers = _chain(env)
    if len(layers) != len(state["layers"]):
        raise ValueError(f"saved env state has {len(state['layers'])} wrapper layers, this env {len(layers)}")
    for layer, attrs in zip(layers, state["layers"]):
        for k, v in attrs.items():
            setattr(layer, k, copy.deepcopy(v))
    inner = env.unwrapped
    inner.np_random.bit_generator.state = copy.deepcopy(state["rng"])
    if "physics" in state:
        set_physics_state(inner.model, inner.data, state["physics"])
