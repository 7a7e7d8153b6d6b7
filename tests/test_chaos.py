"""The chaos harness (`python -m rlinf_like.chaos`): it kills the processes a run lists in workers.json, from a seed,
and exits with the run's code. Here the "run" is a small script whose one worker process is replaced when it dies,
as a run with `runner.max_restarts` relaunches its groups (tests/test_faults.py kills a real run's actor)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

RUN = textwrap.dedent('''
    import json, subprocess, sys, time
    from pathlib import Path
    out = Path(sys.argv[1]); out.mkdir(exist_ok=True)
    deaths = 0
    for attempt in range(3):
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (out / "workers.json").write_text(json.dumps({"actor": [worker.pid]}))
        rc = worker.wait()  # only a kill ends it early
        deaths += rc == -9
        if deaths == 2:
            break
    (out / "deaths").write_text(str(deaths))
    sys.exit(0 if deaths == 2 else 3)
''')


def chaos(tmp_path, *options):
    out = tmp_path / "run"
    return subprocess.run([sys.executable, "-m", "rlinf_like.chaos", *options, "--", sys.executable, "-c", RUN,
                           str(out), f"runner.output_dir={out}"], capture_output=True, text=True, timeout=120)


def test_kills_the_listed_workers_from_a_seed_and_exits_with_the_runs_code(tmp_path):
    done = chaos(tmp_path, "--kills", "2", "--seed", "3", "--min-gap", "0.2", "--max-gap", "0.5")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert [k["component"] for k in report["chaos"]] == ["actor", "actor"] and report["returncode"] == 0
    assert report["chaos"][0]["pid"] != report["chaos"][1]["pid"]  # the replacement was found in workers.json
    assert (tmp_path / "run" / "deaths").read_text() == "2"
    assert done.stdout.count("chaos: killed actor[rank 0]") == 2


def test_refuses_a_command_without_its_output_dir(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlinf_like.chaos", "--kills", "1", "--", sys.executable, "-c",
                           "pass"], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "runner.output_dir" in done.stderr


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_a_seeded_chaos_run_ends_with_the_weights_of_a_fault_free_run(tmp_path):
    """The collocated preset on Ray, two workers SIGKILLed at seeded times, against the same run without faults:
    the final weights are sha256-equal (tests/test_faults.py checks one restart in the default suite)."""
    import hashlib
    import os

    main = ["examples/reasoning/main_grpo.py", "runner.sft_steps=0", "runner.max_steps=12", "runner.save_every=2",
            "runner.eval_every=100", "rollout.logprobs=rescored"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    faulty, straight = tmp_path / "faulty", tmp_path / "straight"
    done = subprocess.run([sys.executable, "-m", "rlinf_like.chaos", "--kills", "2", "--seed", "1", "--min-gap", "12",
                           "--max-gap", "18", "--", sys.executable, *main, "runner.max_restarts=2",
                           f"runner.output_dir={faulty}"], capture_output=True, text=True, timeout=600, env=env,
                          cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len(json.loads(done.stdout.strip().splitlines()[-1])["chaos"]) == 2
    assert len((faulty / "faults.jsonl").read_text().splitlines()) == 2
    clean = subprocess.run([sys.executable, *main, f"runner.output_dir={straight}"], capture_output=True, text=True,
                           timeout=600, env=env, cwd=ROOT)
    assert clean.returncode == 0, clean.stderr[-3000:]
    digest = lambda out: hashlib.sha256((out / "final_model" / "model.safetensors").read_bytes()).hexdigest()
    assert digest(faulty) == digest(straight)


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_embodied_ppo_survives_a_killed_env_worker_with_a_fault_free_runs_weights(tmp_path):
    """Embodied PPO on CartPole on Ray, its env worker SIGKILLed mid-run: the run restores the env state from the
    checkpoint, and its final weights and optimizer state (the checkpoint's tensor file) and its history equal a
    fault-free run's."""
    import hashlib
    import os

    main = ["examples/embodied/main_embodied.py", "env=cartpole", "runner.steps_per_rollout=64", "env.num_envs=8",
            "runner.save_every=2", "runner.total_env_steps=8192"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    faulty, straight = tmp_path / "faulty", tmp_path / "straight"
    done = subprocess.run([sys.executable, "-m", "rlinf_like.chaos", "--kills", "1", "--seed", "0", "--min-gap", "1",
                           "--max-gap", "2", "--wait-for", "checkpoint/runner.json", "--components", "env", "--", sys.executable, *main,
                           "runner.max_restarts=1", f"runner.output_dir={faulty}"], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [fault] = [json.loads(line) for line in (faulty / "faults.jsonl").read_text().splitlines()]
    assert fault["group"] == "env" and fault["resumed_from"] >= 2  # mid-run: the env state comes from a checkpoint
    clean = subprocess.run([sys.executable, *main, f"runner.output_dir={straight}"], capture_output=True, text=True,
                           timeout=600, env=env, cwd=ROOT)
    assert clean.returncode == 0, clean.stderr[-3000:]
    tensors = lambda out: hashlib.sha256(next((out / "checkpoint").glob("step_*/actor/dcp/__0_0.distcp"))
                                         .read_bytes()).hexdigest()
    assert tensors(faulty) == tensors(straight)
    history = lambda out: [{k: v for k, v in h.items() if not k.endswith(("_s", "per_s"))}
                           for h in json.loads((out / "checkpoint" / "runner.json").read_text())["history"]]
    assert history(faulty) == history(straight)


@pytest.mark.extended
@pytest.mark.timeout(900)
@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_an_async_run_survives_kills_and_trains_each_group_once(tmp_path, policy):
    """The async schedule on Ray, two workers SIGKILLed mid-run: the samples are not replayed bit for bit (the
    replicas serve ahead of the trainer and take new weights between decode steps), so what is checked is the
    account by request id in the final checkpoint: every step's groups trained on once, none lost."""
    import os

    from rlinf_like.runners.reasoning.async_stream import account

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "rlinf_like.chaos", "--kills", "2", "--seed", "4", "--min-gap", "3",
                           "--max-gap", "6", "--wait-for", "checkpoint/runner.json", "--", sys.executable,
                           "examples/reasoning/main_grpo.py", "--config-name", "grpo_pipelined", "runner.schedule=async",
                           f"runner.stale_policy={policy}", "runner.max_staleness=1", "runner.sft_steps=0",
                           "runner.max_steps=20", "runner.save_every=2", "runner.max_restarts=2",
                           f"runner.output_dir={out}"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert len((out / "faults.jsonl").read_text().splitlines()) == 2
    state = json.loads((out / "checkpoint" / "runner.json").read_text())
    samples = account(state["extra"]["ledger"], 32, policy)
    assert samples.complete and samples.steps == list(range(20)), str(samples)
    assert "async samples: " in done.stdout + done.stderr and "each once, none missing" in done.stdout + done.stderr
