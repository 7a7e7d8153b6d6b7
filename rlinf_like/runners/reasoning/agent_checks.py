"""The `agent` section checked before any worker starts, each refusal naming its key and the allowed values."""

from __future__ import annotations

from rlinf_like.envs.text import TEXT_ENVS
from rlinf_like.runners.reasoning.schedules import SCHEDULES, STATIC, schedules_with
from rlinf_like.workers.rollout.engine import check_serves_continuously



def check_agent(cfg) -> None:
    a = cfg.agent
    if not a.multi_turn:
        if a.tools:
            raise ValueError(f"agent.tools={a.tools} is read by agent.env=tools only; agent.env is empty")
        return
    if a.env and a.program:
        raise ValueError(f"agent.env={a.env!r} and agent.program={a.program!r}: set one (an environment the "
                         f"rollout runs, or an agent program driven through the endpoint)")
    if a.env:
        env = TEXT_ENVS.get(a.env)
        env.check(a)  # unknown: names agent.env and the choices; then what the env needs
        if env.data_source is not None and cfg.data.source != env.data_source:
            raise ValueError(f"agent.env={a.env} plays the tasks of data.source={env.data_source}, got data.source="
                             f"{cfg.data.source!r}")
    else:
        from rlinf_like.workers.rollout.agentic.agent_program import resolve_program

        resolve_program(a.program)  # a module or function that is not there: named now, not in a worker
    if cfg.data.chat_template == "none":
        raise ValueError("agent.env / agent.program render every turn through a chat template: data.chat_template "
                         "must be auto (the tokenizer's own) or a Jinja file, not none")
    check_serves_continuously(cfg.rollout, "multi-turn rollouts (agent.env / agent.program)")  # turns join the batch
    schedule = None if cfg.runner.schedule == STATIC else SCHEDULES.get(cfg.runner.schedule)
    drives_model = a.program or (a.env and TEXT_ENVS.get(a.env).drives_model)
    if schedule is not None and schedule.serves_continuously and drives_model:
        raise ValueError(f"runner.schedule={cfg.runner.schedule} runs agent.env episodes; agent.program is not built "
                         f"for it (its endpoint serves one generate call at a time): use "
                         f"{' or '.join(schedules_with(serves_continuously=False, runs_episodes=True))}")
    if schedule is not None and not schedule.runs_episodes:
        raise ValueError(f"multi-turn rollouts run under runner.schedule in {schedules_with(runs_episodes=True)}; "
                         f"got {cfg.runner.schedule!r}")
