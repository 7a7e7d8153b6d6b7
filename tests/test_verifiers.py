"""agent.env=verifiers: an environment written with verifiers (v1) trains unchanged. Its rollouts run verifiers'
own harness, tool server and rubric against our OpenAI-compatible endpoint; training reads the exact tokens
the endpoint recorded. Failures are retried in a fresh session, then exclude the group, naming the episode."""

import importlib.util
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("verifiers") is None:  # a lookup: importing it here would cost every pytest worker
    pytest.skip("the [verifiers] extra (bash scripts/setup.sh installs it)", allow_module_level=True)

from rlinf_like.envs.text.verifiers_env import VerifiersEnv, load  # noqa: E402
from rlinf_like.models import load_tokenizer  # noqa: E402
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model  # noqa: E402
from rlinf_like.runners.reasoning import check_config, train  # noqa: E402
from rlinf_like.workers.rollout import RolloutRequest, SamplingParams  # noqa: E402
from rlinf_like.workers.rollout.agentic.agent_program import ProgramResult, _result, run_programs  # noqa: E402
from rlinf_like.workers.rollout.agentic.agent_rollout import program_result  # noqa: E402
from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer, SessionCall  # noqa: E402
from rlinf_like.envs.text.config import AgentConfig  # noqa: E402
from small_runs import in_process, small_reasoning_config  # noqa: E402
from test_openai_endpoint import Scripted  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples/agentic"))  # where the example environment package lives
TEMPLATE = (ROOT / "examples/agentic/chat_template.jinja").read_text()
ENV = "verifiers_calc"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(str(write_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(max_position_embeddings=512))))


def episodes(tokenizer, texts, rows, retries=0, samples=1):
    scripted = Scripted(tokenizer, texts)
    server = OpenAIServer(scripted.submit, tokenizer, TEMPLATE, "policy", 512)
    server.start()
    try:
        program = VerifiersEnv.program(AgentConfig(env="verifiers", max_turns=3),
                                       SamplingParams(max_new_tokens=48, temperature=1.0))
        return run_programs(program, server, rows, samples, timeout_s=120, retries=retries), scripted
    finally:
        server.close()


def row(index: int) -> dict:
    return {"verifiers_env": ENV, "verifiers_options": {"limit": 8}, "verifiers_task": index}


def test_an_episode_trains_on_the_exact_tokens_and_the_rubric_scores(tokenizer):
    _, tasks = load(ENV, {"limit": 8})
    task = tasks[0].data
    product = eval(task.prompt.removeprefix("What is ").removesuffix("?"))
    call = '<tool_call>{"name":"calculator","arguments":{"expression":"%s"}}</tool_call>' % task.prompt[8:-1]
    answer = "\\boxed{%d}" % product
    [run], _ = episodes(tokenizer, [call, answer], [row(0)])
    assert run.error is None and run.reward == pytest.approx(1.25)  # correct (1.0) + used the calculator (0.25)
    assert run.scores == {"correct": 1.0, "used_calculator": 1.0}
    [trajectory] = run.trajectories
    eos = tokenizer.eos_token_id
    sampled = [tokenizer(t).input_ids + [eos] for t in (call, answer)]
    ids, mask = trajectory.response_ids, trajectory.response_mask
    assert ids[: len(sampled[0])] == sampled[0] and ids[-len(sampled[1]):] == sampled[1]  # the engine's own ids
    inserted = [t for t, m in zip(ids, mask) if m == 0]
    assert tokenizer.decode(inserted) == f"T:{product}<eos>A:"  # the tool server's real answer, then the next turn
    assert trajectory.logprobs[: len(sampled[0])] == [-0.5] * len(sampled[0])


def test_a_dead_model_server_fails_the_episode_by_name(tokenizer):
    """The environment's calls fail (the endpoint refuses every request): the trace is not ok, so the episode is an
    environment failure naming the environment and task, and its group is excluded naming the request and sample."""
    runs, _ = episodes(tokenizer, [], [row(1)], retries=0)
    [run] = runs
    assert run.env_failed and run.retries == 0
    assert "verifiers environment 'verifiers_calc', task 1" in run.error
    request = RolloutRequest("req-7", [1, 2], SamplingParams(max_new_tokens=4), 1)
    result = program_result(request, runs, version=0)
    assert result.excluded.startswith("EnvironmentFailed: verifiers environment") and \
        "(request req-7, sample 0, after 0 retries)" in result.excluded


def test_an_environment_failure_reruns_in_a_fresh_session_then_counts(tokenizer):
    """`EnvironmentFailed` reruns the episode in a new session (the failed attempt's calls train nothing)."""
    from rlinf_like.workers.rollout.agentic.agent_program import EnvironmentFailed

    seen = []

    def flaky(base_url, row):
        seen.append(base_url)
        if len(seen) == 1:
            raise EnvironmentFailed("the tool server died")
        return {"reward": 1.0, "scores": {"correct": 1.0}}

    server = OpenAIServer(Scripted(tokenizer, []).submit, tokenizer, TEMPLATE, "policy", 512)
    server.start()
    try:
        [ok] = run_programs(flaky, server, [{}], 1, timeout_s=30, retries=1)
        [failed] = run_programs(lambda b, r: (_ for _ in ()).throw(EnvironmentFailed("down")), server, [{}], 1,
                                timeout_s=30, retries=2)
    finally:
        server.close()
    assert seen[0].endswith("/sessions/ep-0-0/v1") and seen[1].endswith("/sessions/ep-0-0-retry1/v1")
    assert ok.error is None and ok.retries == 1 and ok.scores == {"correct": 1.0} and not ok.env_failed
    assert failed.env_failed and failed.retries == 2 and failed.error == "EnvironmentFailed: down"


def test_a_re_rendered_history_is_refused_by_name():
    first = SessionCall(prompt_ids=[1, 2], response_ids=[3], logprobs=[-1.0], finish_reason="stop", version=0)
    rewritten = SessionCall(prompt_ids=[1, 2, 9, 4], response_ids=[5], logprobs=[-1.0], finish_reason="stop",
                            version=0)
    outcome = {"reward": 1.0, "formatted": True, "seconds": 0.1}
    kept: ProgramResult = _result(0, 0, "s", outcome, [first, rewritten])  # a user's program: its last call's
    assert kept.error is None and kept.reward == 1.0 and len(kept.trajectories) == 2
    result: ProgramResult = _result(0, 0, "s", outcome, [first, rewritten], refuse_rerender=True)
    assert result.env_failed and result.reward == 0.0
    assert result.error.startswith("re-rendered history: its 2 calls make 2 separate trajectories")


def verifiers_config(out):
    cfg = small_reasoning_config(out, samples_per_prompt=2)
    cfg.agent.env, cfg.agent.max_turns, cfg.agent.max_total_tokens = "verifiers", 2, 96
    cfg.data.source, cfg.data.name, cfg.data.options = "verifiers", ENV, {"limit": 12}
    cfg.data.test_problems, cfg.data.sft_problems = 1, 20
    cfg.data.chat_template = str(ROOT / "examples/agentic/chat_template.jinja")
    cfg.runner.prompts_per_step, cfg.runner.max_new_tokens, cfg.runner.eval_every = 1, 16, 100
    cfg.model.max_positions = 320
    return cfg


def test_the_tasks_must_come_from_the_environment(tmp_path):
    cfg = verifiers_config(tmp_path)
    cfg.data.source, cfg.data.name, cfg.data.options, cfg.data.sft_problems = "arithmetic", "", {}, 32
    with pytest.raises(ValueError, match=r"agent.env=verifiers plays the tasks of data.source=verifiers, "
                                         r"got data.source='arithmetic'"):
        check_config(cfg)


@pytest.mark.extended  # ~8 CPU-s an episode (verifiers' tool server and harness processes); the episodes and
@pytest.mark.timeout(300)  # retries are tested above, the agentic runner's resume in test_agentic_runner.py
def test_a_two_step_grpo_run_on_the_example_environment_resumes_mid_run(tmp_path):
    """Step 1, a checkpoint, then the same run resumed for step 2: the history of step 1 is kept."""
    cfg = verifiers_config(tmp_path)
    cfg.runner.save_every, cfg.runner.max_steps = 1, 1
    first = train(in_process(cfg)).history
    cfg.runner.max_steps, cfg.runner.resume = 2, True
    resumed = train(in_process(cfg)).history
    assert resumed[: len(first)] == first and [h["step"] for h in resumed if "reward" in h] == [1, 2]
    for h in (h for h in resumed if "reward" in h):  # the rubric's functions, per step; no episode excluded
        assert {"reward/correct", "reward/used_calculator"} <= set(h) and h["agent/excluded_groups"] == 0

@pytest.mark.extended
def test_demonstrations_play_through_the_environment(tokenizer):
    """The warm start's rows are episodes the environment itself played with a scripted model: its tool list in
    the prompt, the tool server's real answer in the target (mask 0), the demonstration's turns (mask 1)."""
    from rlinf_like.workers.rollout.agentic.demonstrations import play_demonstrations

    _, tasks = load(ENV, {"limit": 8})
    demos = [tasks[0].data.demo]
    program = VerifiersEnv.program(AgentConfig(env="verifiers", max_turns=3),
                                   SamplingParams(max_new_tokens=48, temperature=1.0))
    played = play_demonstrations(program, tokenizer, TEMPLATE, tokenizer.eos_token_id, [row(0)], demos, 512)
    for (prompt, target, mask), demo, task in zip(played, demos, tasks):
        assert tokenizer.decode(prompt) == f"S:tools: calculator(expression)<eos>U:{task.data.prompt}<eos>A:"
        assert tokenizer.decode([t for t, m in zip(target, mask) if m]) == f"{demo[0]}<eos>{demo[1]}<eos>"
        assert tokenizer.decode([t for t, m in zip(target, mask) if not m]) == f"T:{task.data.answer}<eos>A:"
    with pytest.raises(ValueError, match=r"the demonstration of row .* does not play through the environment: the "
                                         r"episode ended with 1 demonstration messages unplayed"):
        play_demonstrations(program, tokenizer, TEMPLATE, tokenizer.eos_token_id, [row(2)],
                            [["\\boxed{1}", "one more"]], 512)
