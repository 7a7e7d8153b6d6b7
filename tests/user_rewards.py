"""An example user reward module, as `reward.fn=user_rewards:where_scored` names it. The tests folder
is on the Ray workers' path (the driver's source folders are), so the reward worker can import it."""

import os


def where_scored(response: str, answer: str, **info) -> dict:
    """1 when the answer appears in the response; reports the process that scored it, the response's
    length and the data row's `level` column."""
    return {"reward": float(answer in response), "pid": os.getpid(), "num_tokens": info["num_tokens"],
            "level": info.get("level", -1)}
