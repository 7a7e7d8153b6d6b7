"""OpenEnv environments through `agent.env=openenv` (`envs/text/openenv_env.py`): the example game
(`examples/agentic/openenv_guess/server.py`, written with openenv-core's server helpers) served by uvicorn as a real
local process, each episode its own WebSocket session, the trajectory exactly the engine's tokens, and a server
that dies surfacing as the episodes' failure, naming them."""

import importlib.util

import pytest

if importlib.util.find_spec("openenv") is None:  # a lookup, not an import: the package pulls in ~8 s of web UI
    pytest.skip("the [openenv] extra (scripts/setup.sh installs it)", allow_module_level=True)

from rlinf_like.envs.text.config import AgentConfig, OpenEnvOptions  # noqa: E402
from rlinf_like.envs.text.openenv_env import OpenEnvText, serve  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, char_tokenizer, end_turns_like, write_tiny_model  # noqa: E402
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine  # noqa: E402
from rlinf_like.workers.rollout.agentic.agent_loop import AgentLimits, AgentLoop  # noqa: E402
from test_agent_loop import RecordingClient  # noqa: E402  (the engine client that keeps every turn)

APP = "examples.agentic.openenv_guess.server:app"
TEMPLATE = "examples/agentic/chat_template.jinja"
LIMITS = AgentLimits(max_turns=4, max_total_tokens=400, max_new_tokens_per_turn=32, env_timeout_s=30.0)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    spec = TinyModelSpec(max_position_embeddings=1024)
    path = end_turns_like(write_tiny_model(tmp_path_factory.mktemp("tiny"), spec))
    return make_engine(RolloutConfig(engine="native", model_path=str(path), max_batch_size=16, kv_cache_memory_gb=0.1,
                                     dtype="float32"))


def play(engine, base_url, requests=2, n=2, limits=LIMITS):
    reqs = [RolloutRequest(f"g{i}", [], SamplingParams(temperature=1.0, seed=7 + i), n=n) for i in range(requests)]
    rows = [{"seed": i} for i in range(requests)]  # reset(seed=...): the secret number of each task
    with RecordingClient(engine) as client:
        loop = AgentLoop(client, char_tokenizer(), TEMPLATE,
                         lambda: OpenEnvText(base_url, reset_keys=("seed",), message_timeout_s=10.0), limits)
        return loop.run(reqs, rows), client


def test_episodes_over_a_served_openenv_game_keep_the_engines_tokens(engine):
    base_url = serve(APP)
    assert serve(APP) == base_url  # one server per process
    results, client = play(engine, base_url)
    tok = char_tokenizer()
    for result in results:
        assert not result.excluded
        opening = tok.decode(result.prompt_ids)
        assert "I picked a number from 1 to 8. Guess it: reply with one number." in opening
        for j, response in enumerate(result.response_ids):
            info, mask = result.episodes[j], result.response_masks[j]
            assert info.end_reason in ("answer", "max_turns", "max_total_tokens", "length") and info.turns >= 1
            model_tokens = [t for t, m in zip(response, mask) if m == 1]
            engine_tokens = [t for turn in range(info.turns)
                             for t in client.turns[f"{result.request_id}/{j}/{turn}"][1].response_ids[0]]
            assert model_tokens == engine_tokens  # never re-tokenized
            env_text = tok.decode([t for t, m in zip(response, mask) if m == 0])
            assert info.turns == 1 or any(w in env_text for w in ("higher", "lower", "no number", "out of guesses"))


def test_an_unknown_server_or_app_is_refused_by_key_and_a_dead_server_fails_the_episodes_by_name(engine):
    with pytest.raises(ValueError, match=r"agent.env=openenv needs exactly one of agent.openenv.base_url"):
        OpenEnvText.check(AgentConfig(env="openenv"))
    nope = "examples.agentic.openenv_guess.server:nope"
    with pytest.raises(ValueError, match=f"agent.openenv.app='{nope}': module 'examples.agentic.openenv_guess.server' "
                                         f"has no 'nope'"):
        OpenEnvText.check(AgentConfig(env="openenv", openenv=OpenEnvOptions(app=nope)))
    results, _ = play(engine, "http://127.0.0.1:9", requests=1, n=2)  # nothing listens there
    excluded = results[0].excluded
    assert excluded.startswith('env.reset: ConnectionError("Failed to connect to ws://127.0.0.1:9/ws')
    assert excluded.endswith("(request g0, sample 0, after 0 retries)")
    assert [e.end_reason for e in results[0].episodes] == ["error", "error"]


@pytest.mark.extended  # the episodes over the served game are tested above; the runner's agentic path, resumed,
def test_grpo_on_the_openenv_example_runs_two_steps(tmp_path):  # in tests/test_agentic_runner.py
    """The documented preset, cut small and in process: the SFT warm-start plays binary search against the server
    the driver serves, and two GRPO steps train on the game's reward. (A resumed run restores nothing of the
    environment's: its sessions live one episode; the calculator preset's resume test covers the episodes' runner.)"""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "run"
    small = ["runner.max_steps=2", "runner.sft_steps=6", "runner.sft_batch_size=8", "runner.eval_every=2",
             "runner.save_every=2", "runner.prompts_per_step=2", "algorithm.samples_per_prompt=2",
             "cluster.backend=local", "cluster.component_placement.actor=0", "cluster.component_placement.rollout=0",
             "cluster.component_placement.reward=0", f"runner.output_dir={out}"]
    done = subprocess.run([sys.executable, "examples/agentic/main_agent.py", "--config-name", "openenv_guess", *small],
                          cwd=root, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    history = json.loads((out / "checkpoint/runner.json").read_text())["history"]
    assert [h["step"] for h in history] == [0, 1, 2]
    for h in history[1:]:
        assert h["agent/excluded_groups"] == 0 and h["agent/env_s"] > 0 and h["agent/turns"] >= 1
        assert 0.0 <= h["reward"] <= 1.0  # the game's reward alone: the reward function adds 0
    assert "higher" in (out / "samples.jsonl").read_text() or "lower" in (out / "samples.jsonl").read_text()
