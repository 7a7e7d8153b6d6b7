"""Simulators behind one vectorized interface (`VectorEnv`): gymnasium (classic control, MuJoCo) and
a custom MuJoCo multi-goal task with offscreen-rendered pixels."""

from rlinf_like.envs.base import ActionSpec, EpisodeStats, FieldSpec, Obs, StepResult, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.factory import ENV_REGISTRY, check_env_config, env_class, make_env

__all__ = ["ENV_REGISTRY", "ActionSpec", "EnvConfig", "EpisodeStats", "FieldSpec", "Obs", "StepResult",
           "VectorEnv", "check_env_config", "env_class", "make_env"]
