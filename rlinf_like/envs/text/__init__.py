"""Text environments (multi-turn, tools): the `TextEnv` interface and its registry, `agent.env`."""

from rlinf_like.envs.text.base import Message, TextEnv, TextStep
from rlinf_like.utils.registry import Registry

TEXT_ENVS: Registry[type[TextEnv]] = Registry("text environment", key="agent.env")
TEXT_ENVS.register("tools", "rlinf_like.envs.text.tool_env:ToolEnv")  # tool calls in the model's chat format
TEXT_ENVS.register("openenv", "rlinf_like.envs.text.openenv_env:OpenEnvText")  # an OpenEnv server's reset / step
TEXT_ENVS.register("verifiers", "rlinf_like.envs.text.verifiers_env:VerifiersEnv")  # a verifiers environment
TEXT_ENVS.register("textarena", "rlinf_like.envs.text.textarena_env:TextArenaText")  # a TextArena single-player game

__all__ = ["TEXT_ENVS", "Message", "TextEnv", "TextStep"]
