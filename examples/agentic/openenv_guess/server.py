"""A small OpenEnv text game, written with openenv-core's server helpers: guess a secret number from 1 to 8.

Each reset draws the secret from its `seed`; each step reads a number from the action's `message`, answers
"higher", "lower" or "correct" in the observation's `message`, and ends on a correct guess (reward 1) or after 4
guesses (reward 0). A reply without a number is told so and costs a guess. The run serves it itself
(`agent.openenv.app`); to serve it by hand, give uvicorn `examples.agentic.openenv_guess.server:app`.
"""

from __future__ import annotations

import random
import re
import sys
from uuid import uuid4

# openenv-core imports its Gradio web UI with the package, ~8 s of CPU in every process that imports it; this server
# serves no UI, and a UI that does not import is what openenv-core falls back to when gradio is absent
sys.modules.setdefault("openenv.core.env_server.web_interface", None)

from openenv.core import Action, Environment, Observation, State, create_fastapi_app
from pydantic import Field

LOW, HIGH, GUESSES = 1, 8, 4


class GuessAction(Action):
    message: str = Field(..., description="the player's reply; its first number is the guess")


class GuessObservation(Observation):
    message: str = Field(default="", description="what the game says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True  # one instance per WebSocket session

    def __init__(self):
        super().__init__()
        self._state, self.secret = State(episode_id=str(uuid4()), step_count=0), LOW

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self.secret = random.Random(seed).randint(LOW, HIGH)
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return GuessObservation(message=f"I picked a number from {LOW} to {HIGH}. Guess it: reply with one number.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        found = re.search(r"-?\d+", action.message)
        left = GUESSES - self._state.step_count
        if found is not None and int(found.group()) == self.secret:
            return GuessObservation(message="correct", done=True, reward=1.0)
        if left == 0:
            return GuessObservation(message=f"out of guesses: it was {self.secret}", done=True, reward=0.0)
        if found is None:
            return GuessObservation(message=f"no number in your reply; {left} guesses left", reward=0.0)
        hint = "higher" if int(found.group()) < self.secret else "lower"
        return GuessObservation(message=f"{hint}; {left} guesses left", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


app = create_fastapi_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=256)
