"""Every shipped YAML preset composes over its dataclass schema and passes the runner's checks, so no
preset names a field the code does not have, or a value the runner would refuse at launch (hydra's
"Key is not in struct" class of failures: LESSONS.md rule 7). No workers start here."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore

from rlinf_like.config import hydra_schema, structure
from rlinf_like.runners.embodied import runner as embodied
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.embodied.config import EmbodiedConfig
from rlinf_like.runners.reasoning import check_config

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REASONING = sorted(p.stem for p in (EXAMPLES / "reasoning" / "config").glob("*.yaml"))
ENVS = sorted(p.stem for p in (EXAMPLES / "embodied" / "config" / "env").glob("*.yaml"))
POLICIES = sorted(p.stem for p in (EXAMPLES / "embodied" / "config" / "policy").glob("*.yaml"))


@pytest.mark.parametrize("preset", REASONING)
def test_reasoning_presets_compose_and_pass_the_runner_checks(preset):
    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    with initialize_config_dir(str(EXAMPLES / "reasoning" / "config"), version_base="1.3"):
        cfg = structure(ReasoningConfig, compose(preset))
    check_config(cfg)
    assert cfg.runner.max_steps > 0 and cfg.cluster.component_placement


@pytest.mark.parametrize("env", ENVS)
@pytest.mark.parametrize("policy", POLICIES)
def test_embodied_presets_compose_and_pass_the_runner_checks(env, policy):
    """Every env x policy preset pair composes; the pairs that fit pass the runner's checks, and a
    policy that cannot read the env's observations is refused there, naming both keys."""
    ConfigStore.instance().store(name="embodied_schema", node=hydra_schema(EmbodiedConfig))
    with initialize_config_dir(str(EXAMPLES / "embodied" / "config"), version_base="1.3"):
        cfg = structure(EmbodiedConfig, compose("embodied", [f"env={env}", f"policy={policy}"]))
    assert cfg.policy.kind == policy.split("_")[0]  # vla_libero: the vla policy with LIBERO's vocabulary
    if (cfg.policy.kind == "vla") == (cfg.env.obs_mode == "pixels"):  # only the vla policy reads images
        embodied.check_config(cfg)
    else:
        with pytest.raises(ValueError, match=rf"policy.kind='{cfg.policy.kind}' reads env.obs_mode in .*not '{cfg.env.obs_mode}'"):
            embodied.check_config(cfg)


def test_presets_were_found():
    assert {"grpo_collocated", "grpo_pipelined"} <= set(REASONING)
    assert {"cartpole", "reacher"} <= set(ENVS) and {"mlp", "vla"} <= set(POLICIES)
