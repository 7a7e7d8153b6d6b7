"""Multi-turn runs on the driver's side: the prompt ids a task's episodes start from, the SFT warm-start's
demonstrations as token ids with the loss on the model's turns only, the per-step episode metrics, and a
trajectory written out for people to read. The rollout renders turns with the same `ChatTokens`, so what the
warm-start teaches is laid out exactly as the rollout's trajectories are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from rlinf_like.data.tasks import Problem
from rlinf_like.envs.text import TEXT_ENVS, TextEnv
from rlinf_like.data.prompts import user_message
from rlinf_like.workers.rollout.agentic.chat_tokens import ChatTokens
from rlinf_like.workers.rollout.types import EpisodeInfo, RolloutResult


def chat_template_text(data_cfg) -> str | None:
    """The multi-turn chat template's Jinja text (`data.chat_template` a file), or None for the tokenizer's own
    (`auto`): the text, not the path, so a rollout on another node renders with the same template."""
    return None if data_cfg.chat_template == "auto" else Path(data_cfg.chat_template).read_text()


def task_row(cfg, p: Problem) -> dict | None:
    """Multi-turn mode: what the environment or agent program starts from, the row's columns with `prompt` as
    the user's message (`data.prompt_template` applied) and `answer`; None in single-turn mode."""
    return {**p.fields, "answer": p.answer, "prompt": user_message(cfg.data, p)} if cfg.agent.multi_turn else None


class AgentFormat:
    """What `PromptFormat` is to single-turn runs: `prompt_ids(p)`, `sft_ids(p)` (here with a loss mask) and
    `describe(p)`, for tasks whose episodes start from `env.reset(row)`."""

    def __init__(self, tokenizer, cfg):
        self.tokenizer, self.cfg = tokenizer, cfg
        self.template = chat_template_text(cfg.data)
        self._chats: dict[str, ChatTokens] = {}
        self._prompts: dict[str, list[int]] = {}
        self._played: dict[str, tuple[list[int], list[int], list[int]]] = {}  # demonstrations played (prepare_sft)

    def env(self) -> TextEnv | None:
        """A step environment for the driver's prompts and demos; None for agent programs and environments that
        drive the model themselves (their episodes open as a program's do)."""
        a = self.cfg.agent
        if not a.env or TEXT_ENVS.get(a.env).drives_model:
            return None
        return TEXT_ENVS.get(a.env).from_config(a, self.cfg.data.system_prompt)

    def chat(self, env: TextEnv | None) -> ChatTokens:
        tools = tuple(env.tools) if env is not None else ()
        key = repr(tools)
        if key not in self._chats:
            self._chats[key] = ChatTokens(self.tokenizer, self.template, tools)
        return self._chats[key]

    def opening(self, env: TextEnv | None, p: Problem) -> list[dict]:
        """The episode's opening messages: the environment's reset, or (an agent program's run) the system
        prompt and the task's user message, which is what a program usually sends first."""
        row = task_row(self.cfg, p)
        if env is not None:
            return env.reset(row)
        system = [{"role": "system", "content": self.cfg.data.system_prompt}] if self.cfg.data.system_prompt else []
        return system + [{"role": "user", "content": row["prompt"]}]

    def prompt_ids(self, p: Problem) -> list[int]:
        key = self._key(p)
        if key not in self._prompts:
            env = self.env()
            try:
                self._prompts[key] = self.chat(env).prompt_ids(self.opening(env, p))
            finally:
                if env is not None:
                    env.close()
        return self._prompts[key]

    def prepare_sft(self, problems: Sequence[Problem]) -> None:
        """An environment that drives the model plays every demonstration through itself once, all at once
        (`demonstrations.py`); `sft_ids` then reads them."""
        a = self.cfg.agent
        if not a.env or not TEXT_ENVS.get(a.env).drives_model:
            return
        from rlinf_like.workers.rollout.agentic.demonstrations import play_demonstrations
        from rlinf_like.workers.rollout.types import SamplingParams

        todo = list({self._key(p): p for p in problems if self._key(p) not in self._played}.values())
        program = TEXT_ENVS.get(a.env).program(a, SamplingParams(max_new_tokens=self.cfg.runner.max_new_tokens,
                                                                  temperature=self.cfg.runner.temperature))
        played = play_demonstrations(program, self.tokenizer, self.template, self.chat(None).end_of_turn,
                                     [task_row(self.cfg, p) for p in todo], [self.demo(p) for p in todo],
                                     max_context=1 << 20)
        self._played.update({self._key(p): ids for p, ids in zip(todo, played)})

    def _key(self, p: Problem) -> str:
        return p.prompt + "\0" + repr(sorted(p.fields.items(), key=lambda kv: kv[0]))

    def demo(self, p: Problem) -> list[str]:
        """The row's worked episode: the assistant's messages under `agent.demo_key`."""
        key = self.cfg.agent.demo_key
        demo = p.fields.get(key)
        if not isinstance(demo, list | tuple) or not demo or not all(isinstance(m, str) for m in demo):
            raise ValueError(f"agent.demo_key={key!r}: the SFT warm-start needs each training row's {key!r} column "
                             f"to be a list of the assistant's messages; row {p.prompt!r} has {demo!r}")
        return list(demo)

    def sft_ids(self, p: Problem) -> tuple[list[int], list[int], list[int]]:
        """(prompt, target, target mask) of a worked episode: the row's `agent.demo_key` column holds the
        assistant's messages; the environment answers each as it would in a rollout (tools really run), and its
        answers are in the target with mask 0, so the warm-start teaches the model's turns only."""
        if self._key(p) in self._played:
            return self._played[self._key(p)]
        key, demo = self.cfg.agent.demo_key, self.demo(p)
        env = self.env()
        try:
            chat = self.chat(env)
            prompt = chat.prompt_ids(self.opening(env, p))
            target, mask = [], []
            for k, text in enumerate(demo):
                ids = self.tokenizer(text, add_special_tokens=False).input_ids + [chat.end_of_turn]
                target += ids
                mask += [1] * len(ids)
                if env is None or k == len(demo) - 1:
                    break
                step = env.step(text)
                if step.done:
                    raise ValueError(f"agent.demo_key={key!r}: row {p.prompt!r}'s demonstration goes on after the "
                                     f"environment ended the episode at message {k}")
                answer = chat.env_ids(list(step.messages or []))
                target += answer
                mask += [0] * len(answer)
            return prompt, target, mask
        finally:
            if env is not None:
                env.close()

    def describe(self, p: Problem) -> str:
        ids = self.prompt_ids(p)
        return f"({len(ids)} tokens, multi-turn: agent.env={self.cfg.agent.env or '-'}, " \
               f"agent.program={self.cfg.agent.program or '-'}):\n{self.tokenizer.decode(ids)}"

    def trajectory(self, result: RolloutResult, sample: int = 0) -> str:
        """One sample's episode as text: the model's turns as written, the environment's answers in [[ ]]."""
        ids, mask = result.response_ids[sample], result.response_masks[sample]
        pieces, start = [], 0
        for t in range(1, len(ids) + 1):
            if t == len(ids) or mask[t] != mask[start]:
                text = self.tokenizer.decode(ids[start:t])
                pieces.append(text if mask[start] else f"[[{text}]]")
                start = t
        text = self.tokenizer.decode(result.prompt_ids) + "".join(pieces)
        return f"{text}\n({episode_summary(result.episodes[sample])})"


def episode_summary(info: EpisodeInfo) -> str:
    """How an episode went, in a line. An agent program's environment (verifiers, an OpenAI agent) runs its tools
    where the trainer does not count them: its line shows the reward it returned and the reward's parts instead."""
    if info.program_reward is None:
        counts = f"tool calls {info.tool_calls}, malformed {info.malformed_calls}"
    else:
        parts = ", ".join(f"{k} {v:g}" for k, v in info.scores.items())
        counts = f"reward {info.program_reward:g}" + (f" ({parts})" if parts else "")
    return f"turns {info.turns}, {counts}, ended: {info.end_reason}{': ' + info.error if info.error else ''}"


def episode_metrics(results: Sequence[RolloutResult]) -> dict[str, float]:
    """Per step, over the episodes of multi-turn results (none for single-turn ones): turns, tool calls, the
    share of episodes that called a tool, the share of calls that were malformed, the wait on environments, and
    how episodes ended (`agent/end/<reason>`, shares)."""
    episodes = [e for r in results for e in r.episodes]
    if not episodes:
        return {}
    n, calls = len(episodes), sum(e.tool_calls for e in episodes)
    malformed = sum(e.malformed_calls for e in episodes)
    out = {"agent/turns": sum(e.turns for e in episodes) / n, "agent/tool_calls": calls / n,
           "agent/tool_call_rate": sum(e.tool_calls > 0 for e in episodes) / n,
           "agent/malformed_rate": malformed / max(calls + malformed, 1),
           "agent/env_wait_s": sum(e.env_wait_s for e in episodes) / n,
           # per step: environment seconds in all, episodes rerun after an environment failure, groups excluded
           "agent/env_s": sum(e.env_wait_s for e in episodes), "agent/env_retries": sum(e.retries for e in episodes),
           "agent/excluded_groups": sum(bool(r.excluded) for r in results)}
    out.update({f"agent/end/{reason}": count / n for reason, count in Counter(e.end_reason for e in episodes).items()})
    for name in sorted({k for e in episodes for k in e.scores}):  # a rubric's functions: means where scored
        scored = [e.scores[name] for e in episodes if name in e.scores]
        out[f"reward/{name}"] = sum(scored) / len(scored)
    return out
