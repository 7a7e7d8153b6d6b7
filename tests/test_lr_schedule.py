import math

import pytest

from rlinf_like.hybrid_engines.lr_schedule import SchedulerConfig, lr_multiplier


def test_constant_with_warmup():
    f = lr_multiplier(SchedulerConfig("constant", warmup_steps=4))
    assert [f(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_linear_decays_to_the_floor_and_stays():
    f = lr_multiplier(SchedulerConfig("linear", warmup_steps=2, total_steps=12, min_lr_ratio=0.1))
    assert [f(0), f(1)] == [0.5, 1.0]
    assert f(2) == 1.0 and f(7) == pytest.approx(0.1 + 0.9 * 0.5) and f(12) == pytest.approx(0.1)
    assert f(100) == pytest.approx(0.1)


def test_cosine_halfway_and_end():
    f = lr_multiplier(SchedulerConfig("cosine", warmup_steps=0, total_steps=10))
    assert f(0) == 1.0 and f(5) == pytest.approx(0.5) and f(10) == pytest.approx(0.0, abs=1e-12)
    assert f(2) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))


def test_bad_schedules_are_named():
    with pytest.raises(ValueError, match="'step'.*constant"):
        lr_multiplier(SchedulerConfig("step"))
    with pytest.raises(ValueError, match="warmup_steps < total_steps"):
        lr_multiplier(SchedulerConfig("cosine", warmup_steps=10, total_steps=10))
