"""Extension points are registries: a component registered by name is reachable from config, and
what its class declares (not its name) decides what config checks accept."""

import sys

import numpy as np
import pytest

from rlinf_like.envs import ENV_REGISTRY, ActionSpec, EnvConfig, FieldSpec, VectorEnv, env_class, make_env
from rlinf_like.models.policies import check_policy_fits, policy_class
from rlinf_like.training.loop import LoopConfig
from rlinf_like.utils.registry import Registry, UnknownNameError
from rlinf_like.workers.actor.backends import BACKEND_REGISTRY, TrainingBackend, backend_class, backends_with
from rlinf_like.workers.actor.worker import ActorConfig, check_actor_config
from rlinf_like.workers.rollout import ENGINE_REGISTRY, RolloutConfig, RolloutEngine, make_engine
from rlinf_like.workers.rollout.engine import LOGPROB_SOURCES, check_rollout_config, engine_class, engines_with


class ToyEngine(RolloutEngine):
    """Answers nothing; declares a rescoring pass and no tensor parallelism."""

    rescored_logprobs = True

    def __init__(self, config, process_group=None, tokenizer=None, device="cpu"):
        super().__init__()
        self.config, self.device = config, device

    def generate(self, requests, on_result=None):
        return []

    def offload(self): ...

    def onload(self): ...

    def weight_layouts(self):
        return []

    def weight_tensors(self):
        return {}


class ToyTPEngine(ToyEngine):
    supports_tp = True


@pytest.fixture
def toy_engines():
    ENGINE_REGISTRY.register("toy")(ToyEngine)
    ENGINE_REGISTRY.register("toy_tp", f"{__name__}:ToyTPEngine")  # lazily, by import path, as the built-ins
    yield
    ENGINE_REGISTRY.unregister("toy")
    ENGINE_REGISTRY.unregister("toy_tp")


def test_a_registered_engine_is_built_by_name_and_its_declarations_drive_the_checks(toy_engines):
    engine = make_engine(RolloutConfig(engine="toy", logprobs="rescored"), device="cpu")
    assert isinstance(engine, ToyEngine) and engine_class("toy_tp") is ToyTPEngine
    # tensor parallelism: refused for the toy, which does not declare it, naming the key and who can
    with pytest.raises(ValueError, match=r"rollout.tp_size=2: rollout.engine='toy' runs on one rank; tensor "
                                         r"parallelism needs rollout.engine in \['native', 'sglang', 'toy_tp', 'vllm'\]"):
        check_rollout_config(RolloutConfig(engine="toy"), tp_size=2)
    assert check_rollout_config(RolloutConfig(engine="toy_tp"), tp_size=2) is ToyTPEngine
    # rescored logprobs: the toys declare them, so they join native in what the check allows
    assert engines_with("rescored_logprobs") == ["native", "toy", "toy_tp"]
    with pytest.raises(ValueError, match=r"rollout.logprobs=rescored is built into the native / toy / toy_tp "
                                         r"engines only; rollout.engine='hf'"):
        check_rollout_config(RolloutConfig(engine="hf", logprobs="rescored"))
    with pytest.raises(ValueError, match=r"rollout.engine='trtllm' is not one of \['hf', 'native', 'sglang', 'toy', "):
        make_engine(RolloutConfig(engine="trtllm"))


def test_builtin_engines_declare_what_they_can_do_without_importing_their_gpu_stack(monkeypatch):
    monkeypatch.setitem(sys.modules, "sglang", None)  # any `import sglang` or `import vllm` would fail
    monkeypatch.setitem(sys.modules, "vllm", None)
    declared = {name: (cls.supports_tp, cls.continues_migrated, cls.rescored_logprobs, cls.needs_gpu,
                       cls.implements_families) for name in ENGINE_REGISTRY.names() for cls in [engine_class(name)]}
    assert declared == {"native": (True, True, True, False, True), "hf": (False, False, False, False, False),
                        "sglang": (True, True, False, True, False), "vllm": (True, False, False, False, False)}
    assert LOGPROB_SOURCES == ("sampled", "rescored")


def test_backends_declare_parallelism_and_elasticity():
    assert BACKEND_REGISTRY.names() == ["fsdp", "megatron"]
    fsdp, megatron = backend_class("fsdp"), backend_class("megatron")
    assert (fsdp.supports_tp, fsdp.supports_pp, fsdp.elastic, fsdp.extra) == (False, False, True, None)
    assert (megatron.supports_tp, megatron.supports_pp, megatron.elastic, megatron.extra) == (True, True, False, "megatron")
    assert backends_with("elastic") == ["fsdp"]
    assert (megatron.reference_parallel, megatron.cpu_precision, fsdp.reference_parallel, fsdp.cpu_precision) == (
        True, "fp32", False, None)


def test_a_registered_backend_is_checked_by_its_own_rules():
    @BACKEND_REGISTRY.register("toy")
    class ToyBackend(TrainingBackend):
        supports_pp = True

        @classmethod
        def check(cls, config, owner):
            if config.loop.epochs > 1:
                raise ValueError(f"{owner}.loop.epochs must be 1 under backend=toy")

    try:
        check_actor_config(ActorConfig(backend="toy"))
        with pytest.raises(ValueError, match="critic.loop.epochs must be 1 under backend=toy"):
            check_actor_config(ActorConfig(backend="toy", loop=LoopConfig(epochs=2)), "critic")
        assert backends_with("supports_pp") == ["megatron", "toy"]
    finally:
        BACKEND_REGISTRY.unregister("toy")
    with pytest.raises(ValueError, match=r"actor.backend='toy' is not one of \['fsdp', 'megatron'\]"):
        check_actor_config(ActorConfig(backend="toy"))


class ToyPixelEnv(VectorEnv):
    """Blank 4x4 images; one continuous action; episodes never end."""

    obs_modes = ("pixels",)

    @classmethod
    def from_config(cls, cfg, num_envs, name):
        return cls(num_envs, name)

    def __init__(self, num_envs, name="env"):
        super().__init__(num_envs, name)
        self.obs_spec = {"image": FieldSpec((4, 4, 3), "uint8")}
        self.action_spec = ActionSpec("continuous", (1,), (-1.0,), (1.0,))

    def _reset_one(self, i, seed):
        return {"image": np.zeros((4, 4, 3), np.uint8)}

    def _step_one(self, i, action):
        return self._reset_one(i, None), 0.0, False, False, {}


def test_a_registered_env_is_made_by_name_and_its_observation_kinds_are_checked():
    ENV_REGISTRY.register("toy_pixels")(ToyPixelEnv)
    try:
        env = make_env(EnvConfig(kind="toy_pixels", obs_mode="pixels", num_envs=2), name="toy test")
        assert isinstance(env, ToyPixelEnv) and env.reset(seed=0)["image"].shape == (2, 4, 4, 3)
        with pytest.raises(ValueError, match=r"toy test: env.obs_mode='state' is not one of \['pixels'\]"):
            make_env(EnvConfig(kind="toy_pixels"), name="toy test")
        # the env gives pixels: the policies that read them pass, the state MLP is refused by key
        assert check_policy_fits("vla", "pixels") is policy_class("vla")
        with pytest.raises(ValueError, match=r"policy.kind='mlp' reads env.obs_mode in \['state'\], not 'pixels'; "
                                             r"policies that read 'pixels': \['vla'\]"):
            check_policy_fits("mlp", "pixels")
    finally:
        ENV_REGISTRY.unregister("toy_pixels")
    assert env_class("gym").obs_modes == ("state",) and env_class("reach_colour").obs_modes == ("state", "pixels")


def test_registry_resolves_lazy_entries_once_and_names_the_key():
    table = Registry("thing", key="section.thing")
    table.register("json", "json:dumps")
    assert isinstance(table._items["json"], str)  # not imported until looked up
    import json

    assert table.get("json") is json.dumps and table._items["json"] is json.dumps
    with pytest.raises(ValueError, match="registered twice"):
        table.register("json", "json:loads")
    with pytest.raises(UnknownNameError, match=r"section.thing='yaml' is not one of \['json'\]") as err:
        table.get("yaml")
    assert isinstance(err.value, KeyError) and str(err.value).startswith("section.thing")
