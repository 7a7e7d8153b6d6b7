"""The guessing game's reward function for `reward.fn`: the game's own reward (1 for a correct guess, added by the
rollout as the episode's environment reward) is the signal, so this adds nothing to it. It says whether the last
guess was the secret (`correct`, the accuracy the run reports) and whether the reply held a number (`formatted`)."""

from __future__ import annotations

import re


def won(response: str, answer: str, **info) -> dict:
    numbers = re.findall(r"-?\d+", response)
    return {"reward": 0.0, "correct": bool(numbers) and numbers[0] == answer.strip(), "formatted": bool(numbers)}
