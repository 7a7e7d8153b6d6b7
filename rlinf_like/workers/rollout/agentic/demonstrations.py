"""Worked episodes for environments that drive the model themselves (verifiers): each demonstration is played
through the environment, with a scripted model that answers each of the environment's calls with the next of
the demonstration's assistant messages. What the endpoint records is then exactly what a rollout of that
episode would be: the environment's own prompt and tool list, its tool results, its chat rendering. The SFT
warm start trains on those tokens (the model's turns; the rest masked), so nothing is laid out by hand."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from tqdm import tqdm

from rlinf_like.workers.rollout.agentic.agent_program import AgentProgram, run_programs
from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

SESSION = "demo"
AT_ONCE = 32  # demonstrations played at the same time (each may start processes of its own: tool servers)


class ScriptedModel:
    """A `submit` that answers session `<SESSION>-<row>-0`'s k-th call with its k-th message, ended by the end-of-turn
    token; a call past the last message is refused (the episode then fails, naming it)."""

    def __init__(self, tokenizer, messages: Sequence[Sequence[str]], end_of_turn: int):
        self.tokenizer, self.end_of_turn = tokenizer, end_of_turn
        self.left = {f"{SESSION}-{r}-0": list(texts) for r, texts in enumerate(messages)}

    def submit(self, request: RolloutRequest) -> Future:
        future: Future = Future()
        left = self.left.get(request.request_id.split("/")[0])
        if not left:
            future.set_result(RolloutResult(request.request_id, list(request.prompt_ids),
                                            error="the demonstration has no message left for this call"))
            return future
        ids = self.tokenizer(left.pop(0), add_special_tokens=False).input_ids + [self.end_of_turn]
        future.set_result(RolloutResult(request.request_id, list(request.prompt_ids), [ids], [[0.0] * len(ids)],
                                        ["stop"]))
        return future


def play_demonstrations(program: AgentProgram, tokenizer, chat_template: str | None, end_of_turn: int,
                        rows: Sequence[dict[str, Any]], messages: Sequence[Sequence[str]], max_context: int,
                        timeout_s: float = 300.0) -> list[tuple[list[int], list[int], list[int]]]:
    """Per row: (prompt, target, target mask) of its demonstration played through the environment, `AT_ONCE` at a
    time. A demonstration the environment cannot play through (it fails, ends early or wants more turns) is
    refused naming the row."""
    out = []
    with tqdm(total=len(rows), desc="demonstrations through the environment", unit="episode") as bar:
        for at in range(0, len(rows), AT_ONCE):
            out += _play(program, tokenizer, chat_template, end_of_turn, rows[at:at + AT_ONCE],
                         messages[at:at + AT_ONCE], max_context, timeout_s)
            bar.update(len(rows[at:at + AT_ONCE]))
    return out


def _play(program: AgentProgram, tokenizer, chat_template: str | None, end_of_turn: int,
          rows: Sequence[dict[str, Any]], messages: Sequence[Sequence[str]], max_context: int,
          timeout_s: float) -> list[tuple[list[int], list[int], list[int]]]:
    scripted = ScriptedModel(tokenizer, messages, end_of_turn)
    server = OpenAIServer(scripted.submit, tokenizer, chat_template, "policy", max_context)
    server.start()
    try:
        runs = run_programs(program, server, rows, 1, timeout_s, session_prefix=SESSION, refuse_rerender=True)
    finally:
        server.close()
    out = []
    for run, row in zip(runs, rows):
        left = scripted.left[f"{SESSION}-{run.row_index}-0"]
        if run.error or left or len(run.trajectories) != 1:
            why = run.error or f"the episode ended with {len(left)} demonstration messages unplayed"
            raise ValueError(f"agent.demo_key: the demonstration of row {row.get('prompt')!r} does not play through "
                             f"the environment: {why}")
        t = run.trajectories[0]
        out.append((t.prompt_ids, t.response_ids, t.response_mask))
    return out
