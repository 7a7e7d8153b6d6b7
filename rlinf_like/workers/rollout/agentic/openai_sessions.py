"""What an agent's session of calls to the OpenAI-compatible endpoint becomes for training.

Every call the server answers is recorded as a `SessionCall`: the prompt ids the engine was given and the
ids it sampled, never re-tokenized text. A multi-turn agent resends the whole conversation each turn, so a
call's prompt usually starts with an earlier call's prompt + response; `session_trajectories` then joins
them into one trajectory whose tokens between the model's turns (tool results, user turns, the template's
markup) are masked out. A call that extends no earlier trajectory (the agent rewrote its history, or the
chat template renders the model's earlier turn differently from what it sampled) starts a new one.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class SessionCall:
    """One sample the engine generated for a session (a request with `n` > 1 records `n` calls)."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]  # one per response id
    finish_reason: str  # the engine's: stop | length | abort
    version: int  # the oldest weight version any of its tokens came from


@dataclass(kw_only=True)
class SessionTrajectory:
    """One token sequence to train on: `prompt_ids` then `response_ids`, where `response_mask` is 1 on the
    model's sampled tokens and 0 on the tokens the agent inserted between its calls (their logprob is 0)."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    logprobs: list[float]
    finish_reason: str  # of its last call
    version: int  # the oldest over its calls
    num_calls: int


def session_trajectories(calls: list[SessionCall]) -> list[SessionTrajectory]:
    """Join calls into trajectories, in the order the trajectories start. A call joins the most recent
    trajectory whose whole token sequence its prompt starts with (so a side request between two turns, or
    `n` samples of which the agent continues one, still joins); otherwise it starts a new trajectory."""
    trajectories: list[SessionTrajectory] = []
    for call in calls:
        target = next((t for t in reversed(trajectories) if _extends(call.prompt_ids, t)), None)
        if target is None:
            trajectories.append(SessionTrajectory(
                prompt_ids=list(call.prompt_ids), response_ids=list(call.response_ids),
                response_mask=[1] * len(call.response_ids), logprobs=list(call.logprobs),
                finish_reason=call.finish_reason, version=call.version, num_calls=1))
            continue
        inserted = call.prompt_ids[len(target.prompt_ids) + len(target.response_ids):]
        target.response_ids += list(inserted) + list(call.response_ids)
        target.response_mask += [0] * len(inserted) + [1] * len(call.response_ids)
        target.logprobs += [0.0] * len(inserted) + list(call.logprobs)
        target.finish_reason = call.finish_reason
        target.version = min(target.version, call.version)
        target.num_calls += 1
    return trajectories


def _extends(prompt_ids: list[int], trajectory: SessionTrajectory) -> bool:
    prefix_len = len(trajectory.prompt_ids)
    whole = prefix_len + len(trajectory.response_ids)
    return (len(prompt_ids) >= whole and prompt_ids[:prefix_len] == trajectory.prompt_ids
            and prompt_ids[prefix_len:whole] == trajectory.response_ids)
