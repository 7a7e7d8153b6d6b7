"""Writes the OpenEnv guessing game's tasks (`--config-name openenv_guess`): one row per game, its `seed` passed to
the server's reset, which draws the secret number from it.

    python examples/agentic/data/make_guess_tasks.py

Each row: `prompt` (what the game opens with, for the logs; the episode's own opening comes from the server),
`answer` (the secret, for reading samples), `seed`, and `demo`, the assistant's side of a worked game for the SFT
warm-start: binary search over 1..8, each guess a bare number; the game's replies come from the server itself
during the warm-start. Held-out seeds never appear in train.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOW, HIGH = 1, 8  # as examples/agentic/openenv_guess/server.py


def binary_search(secret: int) -> list[str]:
    low, high, guesses = LOW, HIGH, []
    while True:
        guess = (low + high) // 2
        guesses.append(str(guess))
        if guess == secret:
            return guesses
        low, high = (guess + 1, high) if guess < secret else (low, guess - 1)


def row(seed: int) -> dict:
    secret = random.Random(seed).randint(LOW, HIGH)  # the server's draw
    return {"prompt": f"Guess the number (game {seed}).", "answer": str(secret), "seed": seed,
            "demo": binary_search(secret)}


def main() -> None:
    for name, seeds in (("guess_train.jsonl", range(0, 256)), ("guess_test.jsonl", range(10_000, 10_032))):
        with open(HERE / name, "w") as f:
            for seed in seeds:
                f.write(json.dumps(row(seed)) + "\n")


if __name__ == "__main__":
    main()
