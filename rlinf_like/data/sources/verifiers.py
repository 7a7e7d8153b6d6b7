"""`data.source=verifiers`: the tasks of a verifiers environment (`data.name`, its id; `data.options`, its
taskset's settings). Each problem is one task: its prompt, its `answer` when the task data has one, and the
columns `agent.env=verifiers` needs to find it again in a rollout worker (the environment and the task's
index). The last `data.test_problems` tasks are held out; RL walks the rest in seeded epochs. Tasks whose data
carries a `demo` (the assistant's messages of a worked episode) make the SFT set, at most `data.sft_problems`. The reward is the
environment's own rubric (`reward.fn=auto` reads what the episode returned)."""

from __future__ import annotations

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.data.tasks import Problem


def task_prompt(task) -> str:
    """The user's text of a task: its prompt, or the last user message of a prompt given as messages."""
    prompt = task.data.prompt
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt or [] if getattr(m, "role", None) == "user" or (isinstance(m, dict) and
                                                                               m.get("role") == "user")]
    last = users[-1] if users else None
    content = last.get("content") if isinstance(last, dict) else getattr(last, "content", "")
    return content if isinstance(content, str) else str(content)


class VerifiersSource(DataSource):
    keys = ("name", "options", "test_problems", "sft_problems")
    default_reward = "exact"  # not called: an episode's reward is what its rubric returned (program_reward)

    @classmethod
    def load(cls, cfg) -> Tasks:
        from rlinf_like.envs.text.verifiers_env import load

        if not cfg.name:
            raise ValueError("data.source=verifiers needs data.name: a verifiers environment id (an installed "
                             "package's module, e.g. verifiers_calc)")
        _, tasks = load(cfg.name, dict(cfg.options))
        if len(tasks) <= cfg.test_problems:
            raise ValueError(f"data.name={cfg.name} has {len(tasks)} tasks, not more than data.test_problems="
                             f"{cfg.test_problems}: nothing would be left to train on")
        problems = [Problem(prompt=task_prompt(t), answer=str(getattr(t.data, "answer", "") or ""), solution="",
                            fields={"verifiers_env": cfg.name, "verifiers_options": dict(cfg.options),
                                    "verifiers_task": i, **demo_of(t)})
                    for i, t in enumerate(tasks)]
        split = len(problems) - cfg.test_problems
        sft = [p for p in problems[:split] if "demo" in p.fields][: cfg.sft_problems]
        return Tasks(sft=sft, test=problems[split:], pool=problems[:split], epochs=True)


def demo_of(task) -> dict:
    """`{"demo": [assistant messages]}` when the task's data carries a worked episode (played through the
    environment for the SFT warm start, `workers/rollout/agentic/demonstrations.py`), else nothing."""
    demo = getattr(task.data, "demo", None)
    return {"demo": list(demo)} if demo else {}
