"""Simulators behind one vectorized interface (`VectorEnv`): gymnasium (classic control, MuJoCo) and
a custom MuJoCo multi-goal task with offscreen-rendered pixels."""

from rlinf_like.envs.base import ActionSpec, EpisodeStats, FieldSpec, Obs, StepResult, VectorEnv
from rlinf_like.envs.factory import KINDS, EnvConfig, make_env

__all__ = ["ActionSpec", "EnvConfig", "EpisodeStats", "FieldSpec", "KINDS", "Obs", "StepResult", "VectorEnv", "make_env"]
