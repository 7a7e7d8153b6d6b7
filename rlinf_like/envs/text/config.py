"""The `agent` section: multi-turn rollouts against a text environment, or an agent program trained through
the OpenAI-compatible endpoint. Empty `env` and `program`: one prompt, one completion (the default)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_like.config.validate import bounded
from rlinf_like.envs.tools.base import ToolOptions


@dataclass(kw_only=True)
class OpenEnvOptions:
    base_url: str = ""  # a running OpenEnv server, e.g. http://host:8000; empty: serve `app` in each rollout process
    app: str = ""  # module:app, a FastAPI app made with openenv-core's create_fastapi_app, served locally by uvicorn
    action_field: str = "message"  # the action's text field: each model turn is sent as {action_field: text}
    observation_field: str = "message"  # the observation field shown to the model; missing: the observation as JSON
    reset_keys: list[str] = field(default_factory=list)  # data row columns passed to reset(...) as keyword arguments
    startup_timeout_s: float = bounded(60.0, gt=0)  # a local server must answer /health within this


@dataclass(kw_only=True)
class TextArenaOptions:
    env_id: str = ""  # a TextArena game, e.g. GuessTheNumber-v0, Wordle-v0 (single player)
    seed_key: str = "seed"  # the data row column that seeds each episode's game


@dataclass(kw_only=True)
class VerifiersOptions:
    harness: str = "null"  # the verifiers harness each rollout runs: null (chat with the environment's tools)
    # run the harness's chat program on this interpreter, not in the environment uv would download for it
    host_python: bool = True


@dataclass(kw_only=True)
class AgentConfig:
    # a text environment in envs/text (TEXT_ENVS): tools (tool calls in the model's chat format); "": single turn
    env: str = ""
    tools: list[str] = field(default_factory=list)  # agent.env=tools: the tools offered, from calculator | python | search
    tool_options: ToolOptions = field(default_factory=ToolOptions)  # time, memory and output limits of the tools
    openenv: OpenEnvOptions = field(default_factory=OpenEnvOptions)  # agent.env=openenv: the server and its fields
    textarena: TextArenaOptions = field(default_factory=TextArenaOptions)  # agent.env=textarena: the game
    # agent.env=verifiers: how its rollouts run (the environment and its tasks: data.source=verifiers)
    verifiers: VerifiersOptions = field(default_factory=VerifiersOptions)
    max_turns: int = bounded(4, gt=0)  # assistant turns per episode; more ends it (end reason max_turns)
    # the response side's context budget: the model's tokens plus tool and user tokens; more ends the episode
    max_total_tokens: int = bounded(256, gt=0)
    # an agent program `module:function(base_url, row) -> reward` (or {"reward", "formatted"}), driven through the
    # OpenAI-compatible endpoint the rollout serves (`workers/rollout/agentic/openai_server.py`); "" for none
    program: str = ""
    program_timeout_s: float = bounded(120.0, gt=0)  # a program running longer scores 0 (logged, named)
    # an episode whose environment raised or timed out reruns with a fresh environment up to this many times; then
    # its whole group is excluded from the step (counted), not kept with a skewed group or silently dropped
    env_retries: int = bounded(1, ge=0)
    env_timeout_s: float = bounded(120.0, gt=0)  # one env.reset / env.step longer than this is a failure
    # a step whose share of excluded groups exceeds this stops the run, naming the environment and its last error
    max_excluded_share: float = bounded(0.25, ge=0, le=1)
    demo_key: str = "demo"  # the data column holding a worked episode (the assistant's messages) for the SFT warm-start

    @property
    def multi_turn(self) -> bool:
        return bool(self.env or self.program)
