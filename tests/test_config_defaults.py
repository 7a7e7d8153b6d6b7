"""Every default stated once: a key of the user schema (runners/reasoning/config.py) that a worker config also has takes the
worker config's default (`bounded(LossTerms.kl_beta, ge=0)`), never a literal of its own that could drift."""

import ast
import dataclasses
from pathlib import Path

import pytest

from rlinf_like.algorithms.losses import PolicyLossConfig
from rlinf_like.algorithms.offpolicy import ISThresholds
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.megatron import MegatronConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.training.loop import LoopConfig
from rlinf_like.workers.actor.config import ActorConfig
from rlinf_like.workers.actor.loss import LossConfig
from rlinf_like.workers.critic import CriticConfig

SCHEMA = Path(__file__).resolve().parents[1] / "rlinf_like/runners/reasoning/config.py"
WORKER_CONFIGS = (PolicyLossConfig, LossConfig, LoopConfig, ISThresholds, OptimConfig, FSDPConfig, CriticConfig,
                  ActorConfig, MegatronConfig)
# same name, another meaning: each default belongs to its own layer
DIFFERENT_MEANING = {
    ("ModelSection", "seed"): "the tiny model's initial weights, not the loop's data order",
    ("AlgorithmConfig", "lr"): "the RL learning rate; OptimConfig's is a library default for any manager",
    ("ActorSection", "precision"): "auto here; a manager built directly stays fp32 unless asked",
    ("CriticSection", "lr"): "the value model's RL learning rate; OptimConfig's is a library default",
    ("TeacherSection", "model_path"): "the distillation teacher's checkpoint (empty: none), not the actor's",
}


def literal_default(value: ast.expr) -> bool:
    """`0.2`, `"k3"`, or `bounded(0.2, ...)`: a value written here rather than taken from another config."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "bounded":
        value = value.args[0]
    return isinstance(value, ast.Constant)


def test_no_user_key_restates_a_worker_config_default():
    worker_fields = {f.name for cls in WORKER_CONFIGS for f in dataclasses.fields(cls)}
    restated = []
    for node in ast.parse(SCHEMA.read_text()).body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if (isinstance(item, ast.AnnAssign) and item.value is not None and literal_default(item.value)
                    and item.target.id in worker_fields and (node.name, item.target.id) not in DIFFERENT_MEANING):
                restated.append(f"{node.name}.{item.target.id} = {ast.unparse(item.value)}")
    assert restated == []


def test_each_estimator_with_options_has_its_section():
    """An estimator's settings are its own dataclass, and the algorithm section holds it under the estimator's
    name, so `build_estimator` finds it and --help lists it; nothing restates its defaults."""
    from rlinf_like.algorithms import ADVANTAGE_ESTIMATORS, build_estimator
    from rlinf_like.runners.reasoning.config import AlgorithmConfig

    algorithm = AlgorithmConfig()
    with_options = [n for n in ADVANTAGE_ESTIMATORS.names() if ADVANTAGE_ESTIMATORS.get(n).Options is not None]
    assert {"grpo", "gae"} <= set(with_options)
    for name in with_options:
        assert type(getattr(algorithm, name)) is ADVANTAGE_ESTIMATORS.get(name).Options
        assert build_estimator(name, algorithm).options is getattr(algorithm, name)


# Where a worker config is still assembled from user sections, rather than received as a section: what is left of
# the second config layer. The list shrinks as sections become the configs themselves (`actor.loss` is `LossConfig`,
# `actor.loop` is `LoopConfig`, `rollout` is `RolloutConfig`); a new entry is a new translator, and this test names it.
TRANSLATORS = {
    "reasoning/worker_configs.py:reward_config": "reward.fn=auto resolved by the data source",
    "reasoning/worker_configs.py:loop_terms": "LoopTerms: runner.seed and the memory budget's tokens",
    "reasoning/worker_configs.py:loss_terms": "LossTerms: the KL weight, temperature, mismatch report",
    "reasoning/actor_setup.py:actor_config": "ActorConfig from actor.*, algorithm.lr and the above",
    "reasoning/launch.py:launch_workers": "the critic's CriticConfig; the rollout section with its resolved dtype",
    "embodied/runner.py:_launch": "the embodied actor's FSDPConfig and OptimConfig",
    "embodied/media.py:write_gif": "the env section with render_mode=rgb_array, for the run's GIF",
}
WORKER_CONFIG_NAMES = {cls.__name__ for cls in WORKER_CONFIGS} | {"LossTerms", "LoopTerms", "RewardConfig", "RolloutConfig"}


def _translators() -> set[str]:
    """module:function of every call in runners/ that builds a worker config, or `replace`s a config section."""
    runners = SCHEMA.parents[1]
    found = set()
    for path in sorted(runners.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
                name = getattr(call.func, "id", getattr(call.func, "attr", ""))
                section = name == "replace" and call.args and ast.unparse(call.args[0]).startswith("cfg.")
                if name in WORKER_CONFIG_NAMES or section:
                    found.add(f"{path.relative_to(runners)}:{fn.name}")
    return found


def test_worker_configs_are_assembled_only_by_the_listed_translators():
    found = _translators()
    assert found - set(TRANSLATORS) == set(), "a new place that builds a worker config from user sections"
    assert set(TRANSLATORS) - found == set(), "a translator is gone: take it off the list"


@pytest.mark.parametrize("old, new", [("algorithm.loss=decoupled_ppo", "actor.loss.objective"),
                                      ("algorithm.clip_high=0.28", "actor.loss.clip_high"),
                                      ("algorithm.entropy_coef=0.01", "actor.loss.entropy_coef"),
                                      ("algorithm.epochs=2", "actor.loop.epochs"),
                                      ("algorithm.mini_batches=2", "actor.loop.mini_batches"),
                                      ("runner.micro_batch_size=8", "actor.loop.micro_batch_size"),
                                      ("runner.pack_sequences=true", "actor.loop.pack_sequences"),
                                      ("runner.max_tokens_per_micro_batch=256", "actor.loop.max_tokens_per_micro_batch")])
def test_the_loss_and_loop_keys_moved_to_the_actor_s_sections(old, new):
    """The actor receives `actor.loss` and `actor.loop` as written (LossConfig, LoopConfig); the old keys name them."""
    from rlinf_like.config import ConfigError, check_overrides
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    with pytest.raises(ConfigError, match=rf"'{old.split('=')[0]}' has moved: use {new}"):
        check_overrides(ReasoningConfig, [old])
    check_overrides(ReasoningConfig, [f"{new}={old.split('=')[1]}"])
