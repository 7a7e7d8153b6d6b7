"""`data.source=reasoning_gym`: procedural tasks from the `reasoning-gym` package (offline), e.g.
`data.name=chain_sum`, with the generator's own settings in `data.options`. Each problem keeps its
entry's `metadata`, which `reward.fn=reasoning_gym` (the default with this source) hands to the
package's own scorer. SFT texts are the answer as `\\boxed{N}`,
which both `reward.fn=reasoning_gym` (the package's `<answer>` tags, else what `math` reads) and
`reward.fn=math` read."""

from __future__ import annotations

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.data.tasks import Problem


def _package():
    try:
        import reasoning_gym
    except ImportError as e:
        raise ValueError("data.source=reasoning_gym needs the reasoning-gym package: pip install reasoning-gym") from e
    return reasoning_gym


def generators() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def problems(name: str, size: int, seed: int, options: dict | None = None) -> list[Problem]:
    if size <= 0:
        return []
    try:
        entries = _package().create_dataset(name, size=size, seed=seed, **(options or {}))
    except (TypeError, ValueError, AssertionError) as e:  # the generator's config class checks its settings
        raise ValueError(f"data.options={options} do not fit data.name={name} ({type(e).__name__}: {e})") from e
    return [Problem(prompt=e["question"], answer=str(e["answer"]), solution=f"\\boxed{{{e['answer']}}}",
                    fields={"metadata": e["metadata"]}) for e in entries]


class ReasoningGymSource(DataSource):
    keys = ("name", "options", "sft_problems", "test_problems")
    default_reward = "reasoning_gym"

    @classmethod
    def load(cls, cfg) -> Tasks:
        _package()
        if cfg.name not in generators():
            raise ValueError(f"data.name={cfg.name!r} is not a reasoning_gym generator; choose one of {generators()}")
        sft = problems(cfg.name, cfg.sft_problems, cfg.seed, cfg.options)
        seen = {p.prompt for p in sft}
        test = [p for p in problems(cfg.name, 4 * cfg.test_problems, cfg.seed + 1_000_003, cfg.options)
                if p.prompt not in seen][: cfg.test_problems]
        if len(test) < cfg.test_problems:
            raise ValueError(f"data.name={cfg.name} gives only {len(test)} held-out problems that are not in the "
                             f"{cfg.sft_problems} SFT ones (data.test_problems={cfg.test_problems}); shrink the sets")
        held_out = {p.prompt for p in test}
        pool = [p for p in problems(cfg.name, 20 * max(cfg.sft_problems, cfg.test_problems), cfg.seed + 17,
                                      cfg.options)
                if p.prompt not in held_out]
        return Tasks(sft=sft, test=test, pool=pool, epochs=False)
