"""Schema validation of composed configs, and the hydra demo (the README's main job) end to end."""

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlinf_like.config import ConfigError, structure
from rlinf_like.runtime import ClusterConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Inner:
    lr: float = 1e-3
    steps: int = 10
    mode: str = "collocated"


@dataclass
class Outer:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    train: Inner = field(default_factory=Inner)
    tags: list[str] = field(default_factory=list)


def test_structure_builds_nested_dataclasses():
    cfg = OmegaConf.create({"cluster": {"num_cpus": 2, "component_placement": {"actor,rollout": "0-1"}},
                            "train": {"lr": 1, "steps": 3}, "tags": ["a"]})
    out = structure(Outer, cfg)
    assert out.cluster.num_cpus == 2 and out.cluster.component_placement == {"actor,rollout": "0-1"}
    assert out.train.lr == 1.0 and isinstance(out.train.lr, float) and out.train.steps == 3
    assert out.train.mode == "collocated" and out.tags == ["a"]


def test_unknown_key_names_path_allowed_keys_and_suggestion():
    with pytest.raises(ConfigError) as err:
        structure(Outer, {"train": {"stpes": 3}})
    msg = str(err.value)
    assert "'train.stpes'" in msg and "['lr', 'mode', 'steps']" in msg and "did you mean 'train.steps'" in msg


@pytest.mark.parametrize(
    "data,fragment",
    [({"train": {"steps": "ten"}}, "'train.steps' must be int"),
     ({"train": {"steps": True}}, "'train.steps' must be int"),
     ({"cluster": {"num_cpus": "two"}}, "'cluster.num_cpus'"),
     ({"cluster": {"component_placement": ["0-1"]}}, "'cluster.component_placement' must be a mapping"),
     ({"tags": "a"}, "'tags' must be a list")],
)
def test_wrong_value_type_names_the_key(data, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("[", r"\[")):
        structure(Outer, data)


def _run_demo(*overrides, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "examples/channel_demo.py"), f"demo.log_dir={tmp_path / 'tb'}",
         f"hydra.run.dir={tmp_path / 'hydra'}", *overrides],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )


def test_demo_rejects_a_misspelled_override(tmp_path):
    out = _run_demo("+demo.num_itmes=3", tmp_path=tmp_path)
    assert out.returncode != 0
    assert "unknown config key 'demo.num_itmes'" in out.stderr and "did you mean 'demo.num_items'" in out.stderr


