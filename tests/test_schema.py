"""Choices (`Literal`) and bounds (`bounded`) are checked by `structure` and `check_overrides` with the key
named; every schema dataclass is keyword-only with a comment per key, and `--help` prints them all."""

import dataclasses
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Literal

import pytest
from omegaconf import OmegaConf

from rlinf_like.config import ConfigError, bounded, check_overrides, describe, field_comments, hydra_schema, structure
from rlinf_like.config.show import SCHEMAS, schema
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.embodied.config import EmbodiedConfig

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(kw_only=True)
class Section:
    mode: Literal["a", "b"] = "a"  # the mode
    lr: float = bounded(1e-3, gt=0)  # a rate
    share: float | None = bounded(None, ge=0, lt=1)  # optional, in [0, 1)


@dataclasses.dataclass(kw_only=True)
class Root:
    section: Section = dataclasses.field(default_factory=Section)  # one section


def _schemas(cls: type) -> list[type]:
    """`cls` and every dataclass reachable through its fields."""
    hints = typing.get_type_hints(cls)
    nested = [t for f in dataclasses.fields(cls) for t in [hints[f.name]] if dataclasses.is_dataclass(t)]
    return [cls, *[s for t in nested for s in _schemas(t)]]


@pytest.mark.parametrize("data,message", [
    ({"section": {"mode": "c"}}, "section.mode='c' is not one of ['a', 'b']"),
    ({"section": {"lr": -1}}, "section.lr must be > 0, got -1.0"),
    ({"section": {"lr": 0.0}}, "section.lr must be > 0, got 0.0"),
    ({"section": {"share": 1}}, "section.share must be < 1, got 1.0"),
])
def test_structure_names_the_key_and_what_is_allowed(data, message):
    with pytest.raises(ConfigError) as err:
        structure(Root, data)
    assert str(err.value) == message


def test_values_inside_the_bounds_and_null_optionals_pass():
    out = structure(Root, {"section": {"mode": "b", "lr": 1, "share": None}})
    assert out.section == Section(mode="b", lr=1.0, share=None)


@pytest.mark.parametrize("override,message", [
    ("algorithm.lr=-1", "algorithm.lr must be > 0, got -1.0"),
    ("rollout.dtype=fp8", "rollout.dtype='fp8' is not one of ['auto', 'float32', 'bfloat16', 'float16']"),
    ("runner.nonfinite=ignore", "runner.nonfinite='ignore' is not one of ['skip', 'stop']"),
    ("algorithm.kl_beta=-0.1", "algorithm.kl_beta must be >= 0, got -0.1"),
    ("runner.migrate_at=1", "runner.migrate_at must be < 1, got 1.0"),
])
def test_check_overrides_refuses_bad_values_before_hydra_composes(override, message):
    with pytest.raises(ConfigError) as err:
        check_overrides(ReasoningConfig, [override])
    assert str(err.value) == message


def test_check_overrides_leaves_free_and_interpolated_values_to_later_checks():
    check_overrides(ReasoningConfig, ["cluster.component_placement.actor=0", "runner.output_dir=123",
                                      "algorithm.lr=${runner.sft_lr}", "runner.max_steps=1,2", "~actor.loss.dual_clip"])


@pytest.mark.parametrize("root", [ReasoningConfig, EmbodiedConfig])
def test_every_schema_dataclass_is_keyword_only_with_a_comment_per_key(root):
    for cls in _schemas(root):
        assert all(f.kw_only for f in dataclasses.fields(cls)), f"{cls.__name__} is not kw_only"
        comments = field_comments(cls)
        missing = [f.name for f in dataclasses.fields(cls) if not comments.get(f.name)]
        assert not missing, f"{cls.__name__}: keys without a comment: {missing}"


def test_comments_are_read_from_the_line_and_the_lines_above():
    comments = field_comments(ReasoningConfig().runner.__class__)
    assert comments["max_new_tokens"] == '"3+5=8, 8-2=6. Answer: 6" and EOS'
    assert comments["migrate_at"].startswith("dynamic: once this share")
    assert comments["migrate_at"].endswith("0 = never migrate")


@pytest.mark.parametrize("root", [ReasoningConfig, EmbodiedConfig])
def test_hydra_mirror_has_the_same_defaults(root):
    mirror = OmegaConf.to_container(OmegaConf.structured(hydra_schema(root)))
    assert structure(root, mirror) == root()


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_show_prints_every_key_with_default_choices_and_comment(name, capsys):
    from rlinf_like.config import show

    show.main([name])  # in process: `python -m` runs this main; a process would add ~4 s of imports to the check
    out = capsys.readouterr().out
    rows = describe(schema(name))
    assert len(rows) > 40
    for key, spec, comment in rows:
        assert f"{key} {spec}" in out if spec else f"{key}:  {comment}" in out
        assert comment and comment in out, key
    if name == "reasoning":
        assert "rollout.dtype = 'auto'  one of ['auto', 'float32', 'bfloat16', 'float16']" in out
        assert "algorithm.lr = 0.0005  > 0" in out


def test_main_grpo_help_is_the_schema():
    out = subprocess.run([sys.executable, "examples/reasoning/main_grpo.py", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python examples/reasoning/main_grpo.py")
    assert "runner.nonfinite = 'skip'  one of ['skip', 'stop']" in out.stdout and "logger.wandb = false" in out.stdout
