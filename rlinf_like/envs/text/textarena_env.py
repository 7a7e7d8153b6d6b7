"""A TextArena single-player game as a text environment (`agent.env=textarena`, the `[textarena]` extra).

`agent.textarena.env_id` names the game (e.g. GuessTheNumber-v0, Wordle-v0); the data row's
`agent.textarena.seed_key` column seeds each episode's game. TextArena's observation is the game's whole log so
far: the episode opens with it as the user's message, and each later turn adds only what the log gained since (the
game's answer to the model's move), so the conversation holds each line once. The game's reward, given when it
ends, is the episode's environment reward.
"""

from __future__ import annotations

from typing import Any

from rlinf_like.envs.text.base import Message, TextEnv, TextStep
from rlinf_like.utils.extras import require


class TextArenaText(TextEnv):
    def __init__(self, env_id: str, seed_key: str = "seed", system_prompt: str = ""):
        self.game = require("textarena").make(env_id=env_id)
        self.env_id, self.seed_key, self.system_prompt = env_id, seed_key, system_prompt
        self.log = ""

    @classmethod
    def check(cls, cfg) -> None:
        textarena = require("textarena")  # missing: names the [textarena] extra
        env_id = cfg.textarena.env_id
        if not env_id:
            raise ValueError("agent.env=textarena needs agent.textarena.env_id, a TextArena game such as "
                             "GuessTheNumber-v0")
        try:
            textarena.make(env_id=env_id)
        except Exception as err:  # noqa: BLE001 - TextArena's own error names what it has
            raise ValueError(f"agent.textarena.env_id={env_id!r}: TextArena cannot make it ({err})") from None

    @classmethod
    def from_config(cls, cfg, system_prompt: str = "") -> TextArenaText:
        return cls(cfg.textarena.env_id, cfg.textarena.seed_key, system_prompt)

    def _news(self) -> str:
        """What the game's log gained since the model last saw it."""
        _, log = self.game.get_observation()
        news = log[len(self.log):] if log.startswith(self.log) else log
        self.log = log
        return news.strip()

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.game.reset(num_players=1, seed=row.get(self.seed_key))
        self.log = ""
        opening = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return opening + [{"role": "user", "content": self._news()}]

    def step(self, assistant_message: str) -> TextStep:
        done, _ = self.game.step(action=assistant_message)
        if done:
            rewards, _ = self.game.close()
            return TextStep(None, reward=float((rewards or {}).get(0, 0.0)), done=True, end_reason="answer")
        return TextStep([{"role": "user", "content": self._news()}])
