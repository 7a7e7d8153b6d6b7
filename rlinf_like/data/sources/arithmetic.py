"""`data.source=arithmetic`: generated "3+5-2=" problems with worked solutions (`data/tasks.py`)."""

from __future__ import annotations

from rlinf_like.data.sources.base import DataSource, Tasks
from rlinf_like.data.tasks import ArithmeticSpec, arithmetic_problems, split_train_test


class ArithmeticSource(DataSource):
    keys = ("sft_problems", "test_problems", "terms", "max_operand", "operators")
    default_reward = "math"

    @classmethod
    def load(cls, cfg) -> Tasks:
        spec = ArithmeticSpec(cfg.terms, cfg.max_operand, cfg.operators)
        sft, test = split_train_test(cfg.sft_problems, cfg.test_problems, cfg.seed, spec)
        held_out = {p.prompt for p in test}
        pool = [p for p in arithmetic_problems(20 * cfg.sft_problems, cfg.seed + 17, spec) if p.prompt not in held_out]
        return Tasks(sft=sft, test=test, pool=pool, epochs=False)
