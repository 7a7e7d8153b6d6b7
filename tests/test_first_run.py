"""What a new user meets on a first real run (issue 36): a single data path, a preset given their own files, `--help`
with the preset's values, a wrong preset listing the presets, hydra quoting explained, and mistakes named by key
before Ray starts."""

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore

from rlinf_like.config import cli, hydra_schema
from rlinf_like.runners.reasoning.config import ReasoningConfig

ROOT = Path(__file__).resolve().parents[1]
MAIN = "examples/reasoning/main_grpo.py"
GSM8K = str(ROOT / "tests/data/gsm8k_sample.jsonl")


@pytest.fixture(autouse=True)
def schema_and_clean_command_line(monkeypatch):
    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    monkeypatch.setattr(cli, "_USER_KEYS", None)  # what a command line recorded stays with its test
    monkeypatch.setattr(cli, "_SET_KEYS", None)


def prepare(*argv, preset="grpo_collocated"):
    return cli.prepare_command_line(ReasoningConfig, list(argv), ROOT / MAIN, preset)


def test_a_single_data_path_is_a_one_file_list():
    argv = prepare("data.source=files", f"data.train_files={GSM8K}", f"data.test_files={GSM8K}")
    assert argv[1:] == [f'data.train_files=["{GSM8K}"]', f'data.test_files=["{GSM8K}"]']
    cfg = cli.composed(ReasoningConfig, ROOT / "examples/reasoning/config", "grpo_collocated", argv)
    assert cfg.data.train_files == cfg.data.test_files == [GSM8K]
    assert prepare(f"data.train_files=[{GSM8K}]")[0] == f"data.train_files=[{GSM8K}]"  # a list stays as written


def test_help_shows_the_preset_s_values_and_marks_what_it_changed():
    out = subprocess.run([sys.executable, MAIN, "--config-name", "grpo_smollm2", "runner.max_steps=7", "--help"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "runner.max_steps = 7  (set here; schema default 60)" in out.stdout
    assert "algorithm.lr = 0.0002  (set here; schema default 0.0005)" in out.stdout  # the preset's value
    assert "runner.seed = 0\n" in out.stdout or "runner.seed = 0  " in out.stdout  # unchanged: unmarked
    assert "presets: grpo_collocated, grpo_ifeval_smollm2, grpo_pipelined, grpo_smollm2" in out.stdout


def test_a_wrong_preset_lists_the_presets_and_bad_quoting_names_the_quoting_that_works():
    with pytest.raises(SystemExit) as err:
        prepare("--config-name", "grpo_colocated")
    assert str(err.value).splitlines() == [
        f"--config-name 'grpo_colocated': no such preset in {ROOT / 'examples/reasoning/config'}. Presets:",
        "  --config-name grpo_collocated", "  --config-name grpo_ifeval_smollm2", "  --config-name grpo_pipelined",
        "  --config-name grpo_smollm2", "  --config-name opd_smollm2",
        "Groups, added to any preset: data=chain_sum|gsm8k_files|ifeval_train, model=gemma3|smollm2, "
        "schedule=async|collocated|dynamic|pipelined"]
    with pytest.raises(SystemExit) as err:
        prepare("data.system_prompt=Add {the} numbers.")
    assert str(err.value).startswith("error: cannot parse the override 'data.system_prompt=Add {the} numbers.'")
    assert str(err.value).endswith("""'data.system_prompt="Add {the} numbers."'""")
    assert prepare('data.system_prompt="Add {the} numbers."') == ['data.system_prompt="Add {the} numbers."']


def test_a_preset_takes_your_files_dropping_what_only_its_own_source_reads(caplog):
    from rlinf_like.data.sources import check_data_config

    argv = prepare("data.source=files", f"data.train_files={GSM8K}", "data.test_fraction=0.25",
                   "data.prompt_key=question", preset="grpo_smollm2")
    cfg = cli.composed(ReasoningConfig, ROOT / "examples/reasoning/config", "grpo_smollm2", argv)
    assert cfg.data.options and cfg.data.sft_problems == 200  # the preset's, for reasoning_gym
    with caplog.at_level("INFO"):
        check_data_config(cfg.data)
    assert cfg.data.options == {} and cfg.data.name == ReasoningConfig().data.name
    assert "data.source=files (set on the command line): dropped the preset's data.sft_problems=200" in caplog.text
    # a key the user set for another source is still refused, naming it
    argv = prepare("data.source=files", f"data.train_files={GSM8K}", "data.sft_problems=10", preset="grpo_smollm2")
    cfg = cli.composed(ReasoningConfig, ROOT / "examples/reasoning/config", "grpo_smollm2", argv)
    with pytest.raises(ValueError, match=r"data.sft_problems=10 is read by data.source=arithmetic"):
        check_data_config(cfg.data)


def test_placement_and_batch_mistakes_fail_before_ray_starts(tmp_path, monkeypatch):
    from rlinf_like.runners.reasoning import run as run_module
    from rlinf_like.runners.reasoning.run import ReasoningRun
    from small_runs import small_reasoning_config

    def no_cluster(*args, **kwargs):
        raise AssertionError("Ray was started before the placement was checked")

    monkeypatch.setattr(run_module, "Cluster", no_cluster)
    cfg = small_reasoning_config(tmp_path)
    placement = {"actor": "0-99", "rollout": "0-1", "reward": "0"}
    bad_placement = replace(cfg, cluster=replace(cfg.cluster, component_placement=placement))
    with pytest.raises(ValueError, match=r"^cluster.component_placement.actor='0-99' \(component 'actor'\) uses cpu "
                                         r"devices 2-\d+, but the cluster has \d+ cpu device\(s\)"):
        ReasoningRun(bad_placement).__enter__()
    bad_split = replace(cfg, actor=replace(cfg.actor, loop=replace(cfg.actor.loop, mini_batches=3)))
    with pytest.raises(ValueError, match=r"do not divide by actor ranks \(\d\) x actor.loop.mini_batches \(3\)"):
        ReasoningRun(bad_split).__enter__()


def test_a_model_folder_without_its_tokenizer_names_the_key_and_the_files(tmp_path):
    from rlinf_like.models import load_tokenizer

    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match=r"model.path='.*': the folder has no tokenizer.json .* it holds "
                                                r"\['config.json'\]"):
        load_tokenizer(tmp_path)


def test_config_show_lists_what_each_preset_changes(capsys):
    from rlinf_like.config import show

    show.main(["reasoning"])
    out = capsys.readouterr().out
    assert "  runner.max_steps = 60  > 0\n" in out  # the schema's default, which --help marks as a preset's change
    lines = {line.split(":")[0]: line for line in out.splitlines() if " --config-name " in line}
    assert set(lines) == {"reasoning/ --config-name grpo_collocated", "reasoning/ --config-name grpo_ifeval_smollm2",
                          "reasoning/ --config-name grpo_pipelined",
                          "reasoning/ --config-name grpo_smollm2", "reasoning/ --config-name opd_smollm2",
                          "agentic/ --config-name calculator",
                          "agentic/ --config-name openai_agent", "agentic/ --config-name openenv_guess",
                          "agentic/ --config-name search", "agentic/ --config-name verifiers_calc"}
    assert "actor.lora.rank=16" in lines["reasoning/ --config-name grpo_smollm2"]
    assert "runner.max_steps=150" in lines["reasoning/ --config-name grpo_collocated"]


def test_a_script_finds_its_presets_from_any_folder(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / MAIN), "--config-name", "grpo_pipelined", "--help"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "runner.max_staleness = 1  (set here; schema default 0)" in out.stdout


def test_model_data_and_schedule_groups_compose_onto_any_preset_replacing_its_own_choice():
    config_dir = ROOT / "examples/reasoning/config"
    # grpo_smollm2 is built from schedule=collocated model=smollm2 data=chain_sum: a group given replaces its choice
    argv = prepare("data=gsm8k_files", f"data.train_files={GSM8K}", "schedule=async", preset="grpo_smollm2")
    assert argv[0] == "data=gsm8k_files" and argv[2] == "schedule=async"
    assert {"data.source", "runner.schedule", "cluster.component_placement.rollout"} <= cli.user_overrides()
    cfg = cli.composed(ReasoningConfig, config_dir, "grpo_smollm2", argv)
    assert (cfg.model.path, cfg.data.source, cfg.data.prompt_key) == ("models/smollm2-135m-instruct", "files",
                                                                      "question")
    assert cfg.data.train_files == [GSM8K] and cfg.actor.lora.rank == 16  # the user's file; the preset's LoRA
    assert cfg.data.options == {} and cfg.data.sft_problems == ReasoningConfig().data.sft_problems  # chain_sum's: gone
    assert cfg.data.system_prompt.startswith("Solve the problem.")  # the preset's own keys stay
    assert (cfg.runner.schedule, cfg.runner.max_staleness) == ("async", 1)
    assert dict(cfg.cluster.component_placement) == {"actor": "0", "rollout": "1", "reward": "1", "reference": "0",
                                                     "critic": "0"}
    # on a preset that chose no model or data, the option is laid over it (hydra's +group=option)
    argv = prepare("model=smollm2", "data=chain_sum", "schedule=pipelined")
    assert argv == ["+model=smollm2", "+data=chain_sum", "schedule=pipelined"]
    plain = cli.composed(ReasoningConfig, config_dir, "grpo_collocated", argv)
    assert (plain.data.source, plain.data.name, plain.model.path) == ("reasoning_gym", "chain_sum",
                                                                      "models/smollm2-135m-instruct")
    assert (plain.runner.schedule, plain.cluster.component_placement["actor"]) == ("static", "0")  # by placement
    with pytest.raises(SystemExit, match=r"schedule=asynch: the config group 'schedule' has the options \['async', "):
        prepare("schedule=asynch")


def test_a_preset_s_dict_options_are_replaced_whole_or_set_key_by_key():
    agent = ROOT / "examples/agentic/main_agent.py"

    def options(*argv):
        prepared = cli.prepare_command_line(ReasoningConfig, list(argv), agent, "verifiers_calc")
        return cli.composed(ReasoningConfig, agent.parent / "config", "verifiers_calc", prepared).data.options

    assert options() == {"limit": 400}  # the preset's own
    assert options("data.options={n:120}") == {"n": 120}  # another environment's options, the preset's gone
    assert options("data.options.n=120") == {"limit": 400, "n": 120}  # one key added
    assert options("data.options.limit=3") == {"limit": 3}
    with pytest.raises(Exception, match="data.options"):
        options("data.options=null")


def test_a_group_estimator_with_one_sample_a_prompt_and_a_context_the_prompts_fill_fail_before_ray_starts(
        tmp_path, monkeypatch):
    from rlinf_like.runners.reasoning import run as run_module
    from rlinf_like.runners.reasoning.run import ReasoningRun
    from small_runs import small_reasoning_config

    monkeypatch.setattr(run_module, "Cluster", lambda *a, **k: pytest.fail("Ray was started"))
    cfg = small_reasoning_config(tmp_path)
    for advantage in ("grpo", "rloo"):
        one = replace(cfg, algorithm=replace(cfg.algorithm, advantage=advantage, samples_per_prompt=1))
        with pytest.raises(ValueError, match=rf"^algorithm.samples_per_prompt=1 with algorithm.advantage={advantage}:"
                                             r".*every advantage is 0.*'reinforce_pp'"):
            ReasoningRun(one)
    reinforce = replace(cfg, algorithm=replace(cfg.algorithm, advantage="reinforce_pp", samples_per_prompt=1))
    from rlinf_like.runners.reasoning.checks import check_estimator
    check_estimator(reinforce)  # no group needed: accepted
    short = replace(cfg, rollout=replace(cfg.rollout, max_context=12))
    with pytest.raises(ValueError, match=r"^the longest prompt \(\d+ tokens\) plus runner.max_new_tokens=\d+ does not "
                                         r"fit the rollout's context of 12 tokens \(rollout.max_context\)"):
        ReasoningRun(short).__enter__()


ENTRY_SCRIPTS = ("examples/reasoning/main_grpo.py", "examples/agentic/main_agent.py",
                 "examples/embodied/main_embodied.py", "rlinf_like/eval/ifeval.py")
# what an entry point does before its first line of output, then a progress bar and lines, as a run prints them
PIPED = """
import sys, time
from rlinf_like.utils.logging import end_with_the_reader, setup_logging
from tqdm import tqdm
import logging
end_with_the_reader()
setup_logging()
log = logging.getLogger("rlinf_like.run")
print("first line", flush=True)
with tqdm(total=10**6, desc="GRPO") as bar:
    for _ in range(10**6):
        log.info("a step's line")
        bar.update()
        time.sleep(0.001)
"""


def test_a_run_piped_into_a_reader_that_closes_ends_instead_of_hanging():
    """`main_grpo.py ... | head -1`: the reader goes, the run must end. With Python's default, BrokenPipeError at the
    next print left tqdm's write lock held and an in-process run hung at exit, idle (a whole run shows it: ~10 s, left
    out here); the entry points restore SIGPIPE's default first thing, so the process ends as a Unix tool does."""
    import signal

    for script in ENTRY_SCRIPTS:  # each entry point does it first thing in its __main__ block
        main_block = (ROOT / script).read_text().split('if __name__ == "__main__":', 1)[1]
        assert re.match(r"\s*(from rlinf_like.utils.logging import end_with_the_reader\s*)?end_with_the_reader\(\)",
                        main_block), script
    run = subprocess.Popen([sys.executable, "-c", PIPED], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert run.stdout.readline() == b"first line\n"  # as `head -1` reads it
        run.stdout.close()
        assert run.wait(timeout=30) == -signal.SIGPIPE
    finally:
        run.kill()
