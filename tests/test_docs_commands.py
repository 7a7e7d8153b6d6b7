"""Every command line the docs show runs, cut down to one step.

What counts as a command line (`doc_commands`): in README.md, each line of a fenced code block and
each inline code span; in each example script's module docstring (examples/**/*.py), each line; of
those, the ones that start with `python`, `.venv/bin/python`, `bash`, `sbatch`, `./ray_launch.sh`
or `tensorboard`. A line ending in `\\` continues on the next; a trailing ` # comment` is dropped.

Skipped, and only these (`test_only_setup_cluster_and_viewer_commands_are_skipped` asserts it):
`bash scripts/setup.sh && ...` (the setup CI runs anyway), `sbatch ...` (SLURM), `./ray_launch.sh ...`
and the driver command with `cluster.address=HEAD_IP:...` (a multi-node Ray cluster), `tensorboard ...`
(a viewer that never exits).

Every other command runs, as a shell would split it, from a scratch directory holding links to examples/
and tests/, with its Python
replaced by this interpreter and the overrides of `CUT` appended (hydra and argparse take the last
value of a key), so each trains for one step on tiny batches and writes under the scratch directory.
Two commands whose overrides are the same once cut (`env=cartpole` and `env=cartpole
runner.total_env_steps=30000`) run once. The two preset runs of main_grpo.py (`main_grpo.py` and
`--config-name grpo_pipelined`) are what tests/test_golden_runs.py runs, cut to 6 steps, with every
step's metrics checked: they run there, not twice. The rest run two at a time, the costliest first, the
behaviour-cloning warm start first (the PPO command that starts from its file waits for it).
"""

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parents[1]
STARTS = ("python ", ".venv/bin/python ", "bash ", "sbatch ", "./ray_launch.sh ", "tensorboard ")
SKIPPED = {"setup": "bash scripts/setup.sh", "slurm": "sbatch ", "ray cluster": "./ray_launch.sh ",
           "viewer": "tensorboard ", "multi-node driver": "cluster.address=", "gpu": "scripts/gpu_check.sh",
           "vllm install": "scripts/install_vllm_cpu.sh"}

_REASONING = ("runner.max_steps=1 runner.sft_steps=1 runner.sft_batch_size=4 runner.eval_every=1 runner.save_every=1 "
              "runner.prompts_per_step=2 algorithm.samples_per_prompt=2 runner.output_dir={out}")
_GENERATED = "data.sft_problems=8 data.test_problems=4"  # the generated data's sizes; files keep theirs
_EMBODIED = ("runner.total_env_steps=1 runner.steps_per_rollout=4 runner.stream_chunk_steps=2 env.num_envs=2 "
             "algorithm.epochs=1 algorithm.mini_batches=2 runner.save_every=1 runner.output_dir={out}")
# script -> what makes its run one step long and writes under the scratch directory
CUT = {"examples/reasoning/main_grpo.py": _REASONING, "examples/agentic/main_agent.py": _REASONING, "examples/embodied/main_embodied.py": _EMBODIED,
       "examples/embodied/bc_warmstart.py": "--steps 2 --epochs 1 --num-envs 2 --batch 4",
       "examples/channel_demo.py": "demo.num_items=4 demo.item_mib=0.05 demo.log_dir={out}/tb",
       "rlinf_like.config.show": "",
       # the agentic presets' data writers: they rewrite the shipped files, byte for byte the same
       "examples/agentic/data/make_calculator_tasks.py": "", "examples/agentic/data/make_search_tasks.py": ""}


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of the docs, in document order, each once."""
    found: list[tuple[str, str]] = []
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```[a-z]*\n(.*?)```", readme, re.S)
    spans = re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", re.sub(r"```.*?```", "", readme, flags=re.S))
    found += [("README.md", line) for text in blocks for line in _lines(text)]
    found += [("README.md", " ".join(span.split())) for span in spans]
    for script in sorted((ROOT / "examples").rglob("*.py")):
        doc = re.match(r'\s*(?:from __future__[^\n]*\n\s*)?"""(.*?)"""', script.read_text(), re.S)
        found += [(str(script.relative_to(ROOT)), line) for line in _lines(doc.group(1) if doc else "")]
    seen, out = set(), []
    for where, command in found:
        same = command.removeprefix(".venv/bin/")  # the README's python and a docstring's are one
        if command.startswith(STARTS) and same not in seen:
            seen.add(same)
            out.append((where, command))
    return out


def _lines(text: str) -> list[str]:
    """Lines with `\\` continuations joined and a trailing ` # comment` dropped."""
    joined = re.sub(r"\\+\n\s*", " ", text)  # `\\` in a docstring's source is an escaped `\`
    return [" ".join(re.split(r"\s#\s", line)[0].split()) for line in joined.splitlines()]


def skip_reason(command: str) -> str | None:
    return next((why for why, marker in SKIPPED.items() if marker in command), None)


def _script(command: str) -> str:
    """The script a command runs, or the module of `python -m module`."""
    words = command.split()
    return words[2] if words[1] == "-m" else words[1]


def cut(command: str) -> str:
    """The overrides that cut `command` down (`CUT`, plus the generated data's sizes unless it reads files)."""
    extra = _GENERATED if _script(command).endswith("main_grpo.py") and "data.source=files" not in command else ""
    return f"{CUT[_script(command)]} {extra}"


def effective(command: str) -> tuple[str, ...]:
    """What a command runs once cut: its script and its arguments, a key's last value winning."""
    args = {}
    for word in [*shlex.split(command)[1:], *cut(command).split()]:
        key = word.split("=", 1)[0] if "=" in word and not word.startswith("-") else word
        args.pop(key, None)
        args[key] = word
    return tuple(sorted(args.values()))


def golden_run(command: str) -> str | None:
    """The golden run (tests/test_golden_runs.py) that runs this command's preset, if any."""
    from golden.record import RUNS

    words = command.split()
    if _script(command) != "examples/reasoning/main_grpo.py":
        return None
    preset = ["--config-name", "grpo_collocated"] if len(words) == 2 else words[2:]
    return next((name for name, args in RUNS.items() if args == preset), None)


COMMANDS = doc_commands()
_unique: dict[tuple[str, ...], tuple[str, str]] = {}
for _where, _command in COMMANDS:
    if skip_reason(_command) is None and golden_run(_command) is None:
        _unique.setdefault(effective(_command), (_where, _command))
RUN = list(_unique.values())


def test_only_setup_cluster_and_viewer_commands_are_skipped():
    skipped = sorted((skip_reason(c), c) for _, c in COMMANDS if skip_reason(c))
    assert [why for why, _ in skipped] == ["gpu", "multi-node driver", *["ray cluster"] * 5, "setup", "setup",
                                           "slurm", "viewer", "vllm install"], skipped
    scripts = {_script(c) for _, c in RUN}
    assert scripts == set(CUT), f"a documented script has no cut-down overrides: {scripts - set(CUT)}"
    assert len(RUN) >= 10
    # the preset runs left to the golden test are exactly its collocated and pipelined runs
    assert sorted({golden_run(c) for _, c in COMMANDS} - {None}) == ["collocated", "pipelined"]


def test_readme_placement_overrides_compose_to_the_placement_they_describe():
    """The README's placement overrides for a GPU node, composed over the preset, planned on 8 GPUs."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import check_overrides, hydra_schema, structure
    from rlinf_like.runners.config import ReasoningConfig
    from rlinf_like.scheduler.placement import Device, PlacementMode, plan_placement

    readme = (ROOT / "README.md").read_text()
    forms = [" ".join(s.split()).strip("'") for s in re.findall(r"`'?(cluster\.component_placement[^`]+)`", readme)]
    assert len(forms) >= 2, forms
    devices = {"gpu": [Device("gpu", i, 0, "n", "ip") for i in range(8)], "cpu": [Device("cpu", 0, 0, "n", "ip")]}
    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    for form in forms:
        overrides = [o.input_line for o in OverridesParser.create().parse_overrides(_split(form))]
        check_overrides(ReasoningConfig, overrides)
        with initialize_config_dir(str(ROOT / "examples/reasoning/config"), version_base="1.3"):
            cfg = structure(ReasoningConfig, compose("grpo_collocated", overrides))
        placement = plan_placement(cfg.cluster.component_placement, devices)
        assert placement.relation("actor", "rollout") is PlacementMode.COLLOCATED, form
        assert placement["actor"].world_size == 8 and placement["reward"].device_kind == "cpu", form


def _split(form: str) -> list[str]:
    """Overrides separated by spaces outside braces and quotes."""
    return re.findall(r"""(?:[^\s{"']|\{[^}]*\}|"[^"]*"|'[^']*')+""", form)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    root = tmp_path_factory.mktemp("docs")
    (root / "examples").symlink_to(ROOT / "examples")
    (root / "tests").symlink_to(ROOT / "tests")  # the README's sample data
    return root


def run_command(index: int, command: str, scratch: Path) -> subprocess.CompletedProcess:
    out = scratch / f"out{index}"
    argv = [sys.executable, *shlex.split(command)[1:], *cut(command).format(out=out).split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=400)


# what a command costs, roughly (CPU seconds on the 2-core VM, cut): the agent presets ~55-80, a reasoning run
# ~40-60, an embodied run or the channel demo ~25-40, `--help` and the data writers ~5 or less
COST = {"examples/embodied/bc_warmstart.py": 4, "examples/agentic/main_agent.py": 3, "examples/reasoning/main_grpo.py": 2,
        "examples/embodied/main_embodied.py": 1, "examples/channel_demo.py": 1}


def cost(command: str) -> int:
    return 0 if "--help" in command else COST.get(_script(command), 0)


@pytest.fixture(scope="module")
def results(scratch):
    """Every command's result, two at a time (each starts its own local Ray; two share the 2 cores without
    waiting on each other's start-up), the costly first so that no long run is left alone at the end; the
    producer of a file (the behaviour-cloning warm start) first, and a command that reads its file waits for it."""
    producers = [i for i, (_, c) in enumerate(RUN) if "bc_warmstart.py" in c]
    order = sorted(range(len(RUN)), key=lambda i: (i not in producers, -cost(RUN[i][1])))
    with ThreadPoolExecutor(2) as pool:
        made = [pool.submit(run_command, i, RUN[i][1], scratch) for i in producers]

        def after_producers(i: int) -> subprocess.CompletedProcess:
            if "policy.init_weights=" in RUN[i][1]:  # the warm start's file
                [f.result() for f in made]
            return run_command(i, RUN[i][1], scratch)

        futures = dict(zip(producers, made)) | {i: pool.submit(after_producers, i) for i in order if i not in producers}
        return {i: f.result() for i, f in futures.items()}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first test waits for all of them
@pytest.mark.parametrize("where,command", RUN, ids=[c for _, c in RUN])
def test_documented_command_runs(where, command, results):
    result = results[RUN.index((where, command))]
    assert result.returncode == 0, f"{where}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
