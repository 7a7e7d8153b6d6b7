"""An example of your own reward function, as `reward.fn=my_reward:last_number_reward` names it.

The signature every reward function has: `fn(response: str, answer: str, **info) -> float | dict`.
`info` holds `prompt`, `finished` (the response stopped at EOS), `num_tokens` and the data row's other
columns. Return the reward, or a dict holding "reward" whose other numbers are logged as
`reward/<name>` metrics. The module is imported in the reward worker; a script's own folder (this one
for examples/reasoning/main_grpo.py) and PYTHONPATH reach the workers.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number_reward(response: str, answer: str, **info) -> dict:
    """1 when the response's last number equals the reference (GSM8K style: "... #### 1,234" or plain
    text), else 0; a response cut off at the length limit loses 0.1."""
    numbers = _NUMBER.findall(response)
    guess = numbers[-1].replace(",", "") if numbers else None
    correct = guess is not None and guess == answer.replace(",", "").strip()
    reward = float(correct) - (0.0 if info.get("finished", True) else 0.1)
    return {"reward": reward, "correct": correct, "answered": float(guess is not None)}
