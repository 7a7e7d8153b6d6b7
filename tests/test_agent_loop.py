"""Multi-turn rollouts (`workers/rollout/agentic/agent_loop.py`) on the native engine with a tiny char-level model whose
turns end (`end_turns_like`), the compact chat template, and small real environments written here."""

import threading
import time
from dataclasses import replace
from collections import Counter

import pytest

from rlinf_like.envs.text import TextEnv, TextStep
from rlinf_like.models.tiny import TinyModelSpec, char_tokenizer, end_turns_like, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.agentic.agent_loop import AgentLimits, AgentLoop
from rlinf_like.workers.rollout.engines.engine_client import EngineClient

TEMPLATE = "examples/agentic/chat_template.jinja"
CALC = {"type": "function", "function": {"name": "calc", "parameters": {"properties": {"expr": {"type": "string"}}}}}
LIMITS = AgentLimits(max_turns=4, max_total_tokens=400, max_new_tokens_per_turn=64)


class ToolEnv(TextEnv):
    """Answers every turn with one tool message after `latency_s`, and ends after `done_after` turns (never when
    None); `fail_on`: a row whose step raises. Keeps what it saw and said, and how many envs are in step at once."""

    tools = (CALC,)
    busy = 0
    most_busy = 0
    lock = threading.Lock()

    def __init__(self, latency_s: float = 0.0, done_after: int | None = 3, fail_on: str | None = None):
        self.latency_s, self.done_after, self.fail_on = latency_s, done_after, fail_on
        self.opening, self.seen, self.said = [], [], []

    def reset(self, row):
        self.row = row
        self.opening = [{"role": "system", "content": "Use calc."}, {"role": "user", "content": row["q"]}]
        return self.opening

    def step(self, assistant_message):
        with ToolEnv.lock:
            ToolEnv.busy += 1
            ToolEnv.most_busy = max(ToolEnv.most_busy, ToolEnv.busy)
        try:
            time.sleep(self.latency_s)
        finally:
            with ToolEnv.lock:
                ToolEnv.busy -= 1
        self.seen.append(assistant_message)
        if self.row["q"] == self.fail_on:
            raise RuntimeError(f"tool crashed on turn {len(self.seen)}")
        if self.done_after is not None and len(self.seen) >= self.done_after:
            return TextStep(None, reward=1.0, done=True, info={"tool_calls": 0})
        self.said.append([{"role": "tool", "content": f"={len(self.seen)}"}])
        return TextStep(self.said[-1], reward=0.25, info={"tool_calls": 1, "malformed_calls": len(self.seen) % 2})


class RecordingClient(EngineClient):
    """The engine client, keeping every turn's request and what the engine returned for it."""

    def __init__(self, engine):
        super().__init__(engine)
        self.turns = {}

    def submit_many(self, requests):
        futures = super().submit_many(requests)
        for request, future in zip(requests, futures):
            future.add_done_callback(lambda f, r=request: self.turns.__setitem__(r.request_id, (r, f.result())))
        return futures


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(max_position_embeddings=1024))
    return str(end_turns_like(path))


@pytest.fixture(scope="module")
def engine(model_path):
    # float32: the episodes below end as they do for these draws; bf16 logits move some draws
    return make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=32, kv_cache_memory_gb=0.1,
                                     dtype="float32"))


def rollout(engine, make_env, limits=LIMITS, requests=4, n=2, temperature=1.0, client_type=EngineClient):
    reqs = [RolloutRequest(f"q{i}", [], SamplingParams(temperature=temperature, seed=100 + i), n=n)
            for i in range(requests)]
    rows = [{"q": f"What is {i}+{2 * i}?"} for i in range(requests)]
    envs = []

    def make():
        envs.append(make_env())
        return envs[-1]

    with client_type(engine) as client:
        results = AgentLoop(client, char_tokenizer(), TEMPLATE, make, limits).run(reqs, rows)
    return results, envs, client


def test_the_trajectory_is_the_engines_tokens_and_the_templates_env_tokens(engine):
    tok = char_tokenizer()
    results, envs, client = rollout(engine, ToolEnv, client_type=RecordingClient)
    episodes = [(r, j) for r in results for j in range(len(r.response_ids))]
    assert Counter(r.episodes[j].end_reason for r, j in episodes) == {"answer": 8}
    for (result, j), env in zip(episodes, envs):
        ids, response = result.prompt_ids, result.response_ids[j]
        assert ids == tok.apply_chat_template(env.opening, tools=[CALC], chat_template=open(TEMPLATE).read(),
                                              add_generation_prompt=True, tokenize=True, return_dict=False)
        conversation, at = list(env.opening), 0
        for turn in range(3):
            request, answer = client.turns[f"{result.request_id}/{j}/{turn}"]
            assert request.n == 1 and request.prompt_ids == ids + response[:at]  # the whole trajectory so far
            model = answer.response_ids[0]
            assert response[at:at + len(model)] == model and model[-1] == tok.eos_token_id  # as the engine gave
            assert result.logprobs[j][at:at + len(model)] == answer.logprobs[0]
            assert result.response_masks[j][at:at + len(model)] == [1] * len(model)
            assert env.seen[turn] == tok.decode(model[:-1], skip_special_tokens=True)
            at += len(model)
            conversation.append({"role": "assistant", "content": tok.decode(model[:-1])})
            if turn == 2:
                break
            # the env's tokens: what the template renders for its message and the next generation prompt
            conversation += env.said[turn]
            rendered = tok.apply_chat_template(conversation, tools=[CALC], chat_template=open(TEMPLATE).read(),
                                               add_generation_prompt=True, tokenize=True, return_dict=False)
            env_ids = rendered[len(ids) + at:]
            assert tok.decode(env_ids) == f"T:={turn + 1}<eos>A:"
            assert response[at:at + len(env_ids)] == env_ids
            assert result.response_masks[j][at:at + len(env_ids)] == [0] * len(env_ids)
            assert result.logprobs[j][at:at + len(env_ids)] == [0.0] * len(env_ids)
            at += len(env_ids)
        assert at == len(response) == len(result.logprobs[j]) == len(result.token_versions[j])
        assert result.episodes[j].turns == 3 and result.episodes[j].tool_calls == 2
        assert result.episodes[j].env_reward == 1.5 and result.episodes[j].malformed_calls == 1
        assert result.finish_reasons[j] == "stop"
    assert len({tuple(r.response_ids[0]) for r in results}) == 4  # the requests' seeds differ


@pytest.mark.parametrize("case", ["answer", "max_turns", "max_total_tokens", "length", "context"])
def test_each_limit_ends_the_episode_with_its_reason(case, engine, model_path):
    env, limits = (lambda: ToolEnv(done_after=None)), LIMITS
    if case == "answer":
        env = lambda: ToolEnv(done_after=2)  # noqa: E731
    elif case == "max_turns":
        limits = AgentLimits(max_turns=2, max_total_tokens=400, max_new_tokens_per_turn=64)
    elif case == "max_total_tokens":
        limits = AgentLimits(max_turns=50, max_total_tokens=40, max_new_tokens_per_turn=64)
    elif case == "length":
        limits = AgentLimits(max_turns=50, max_total_tokens=400, max_new_tokens_per_turn=2)
    else:
        limits = AgentLimits(max_turns=50, max_total_tokens=1000, max_new_tokens_per_turn=64)
        engine = make_engine(RolloutConfig(engine="native", model_path=model_path, max_batch_size=8,
                                           kv_cache_memory_gb=0.05, max_context=120))
    results, _, _ = rollout(engine, env, limits)
    infos = [(r, j, r.episodes[j]) for r in results for j in range(len(r.episodes))]
    assert Counter(info.end_reason for _, _, info in infos) == {case: 8}
    for result, j, info in infos:
        response = result.response_ids[j]
        if case in ("answer", "max_turns"):
            assert info.turns == 2 and response[-1] == char_tokenizer().eos_token_id
        elif case == "max_total_tokens":  # a turn cut to the budget left, or a tool answer (7 tokens) past it
            cut = result.finish_reasons[j] == "length"
            assert len(response) == 40 if cut else 40 - 7 < len(response) <= 40
        elif case == "length":
            eos = char_tokenizer().eos_token_id  # the last turn: 2 model tokens, no end-of-turn among them
            assert result.finish_reasons[j] == "length" and result.response_masks[j][-3:] == [0, 1, 1][-len(response):]
            assert eos not in response[-2:] and (info.turns == 1) == (len(response) == 2)
        else:  # the engine stopped at its max context, or a tool answer would not have fit
            total, cut = len(result.prompt_ids) + len(response), result.finish_reasons[j] == "length"
            assert total == 120 if cut else 120 - 7 <= total < 120


def test_an_env_that_raises_ends_its_own_episode_and_the_others_finish(engine):
    results, envs, _ = rollout(engine, lambda: ToolEnv(fail_on="What is 1+2?"))  # a bare loop: no retries
    by_request = {r.request_id: [e.end_reason for e in r.episodes] for r in results}
    assert by_request == {"q0": ["answer"] * 2, "q1": ["error"] * 2, "q2": ["answer"] * 2, "q3": ["answer"] * 2}
    failed = results[1].episodes[0]
    assert failed.turns == 1 and failed.error == "env.step: RuntimeError('tool crashed on turn 1')"
    assert results[1].response_masks[0] == [1] * len(results[1].response_ids[0])  # no env tokens were added
    assert [bool(r.excluded) for r in results] == [False, True, False, False]  # the group is out of the step


def test_episodes_overlap_so_the_engine_decodes_while_tools_wait(engine):
    ToolEnv.most_busy = 0
    began = time.perf_counter()
    # 0.2 s tools: long enough that a decode step slowed by a loaded machine still lands inside the other
    # episodes' tool calls (at 0.05 s a loaded run once saw 11 at once)
    results, envs, _ = rollout(engine, lambda: ToolEnv(latency_s=0.2), requests=8, n=2)
    wall = time.perf_counter() - began
    infos = [e for r in results for e in r.episodes]
    assert [e.turns for e in infos] == [3] * 16
    waited = sum(e.env_wait_s for e in infos)  # what one episode after another would spend on tools alone
    steps = sum(len(env.seen) for env in envs)  # 3 a episode, 2 where the last turn ran out of tokens
    assert steps >= 16 * 2 and waited >= steps * 0.2
    assert ToolEnv.most_busy >= 12  # most tools ran at the same time
    # at 0.05 s tools: 0.33 s against 2.4 s of tool time (ratio 0.14) on 2 shared cores
    assert wall < 0.4 * waited, (wall, waited)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_runs_are_reproducible(engine, temperature):
    first, _, _ = rollout(engine, ToolEnv, temperature=temperature)
    again, _, _ = rollout(engine, ToolEnv, temperature=temperature)
    assert [r.response_ids for r in first] == [r.response_ids for r in again]
    assert [r.response_masks for r in first] == [r.response_masks for r in again]
    samples_differ = all(r.response_ids[0] != r.response_ids[1] for r in first)
    assert samples_differ == (temperature > 0)  # sampled: each sample has its own seeds; greedy: one answer


def test_an_engine_failure_fails_every_episode_instead_of_hanging(engine):
    def broken():
        raise RuntimeError("weights did not arrive")

    with EngineClient(engine) as client:
        client.between_steps = broken
        loop = AgentLoop(client, char_tokenizer(), TEMPLATE, ToolEnv, LIMITS)
        results = loop.run([RolloutRequest("q", [], SamplingParams(seed=1), n=3)], [{"q": "1+1?"}])
        assert [e.error for e in results[0].episodes] == ["engine: RuntimeError('weights did not arrive')"] * 3
        with pytest.raises(RuntimeError, match="weights did not arrive"):
            client.submit(RolloutRequest("later", [5, 6], SamplingParams())).result(timeout=5)


def test_samples_of_a_request_must_share_their_prompt_and_limits_are_checked_by_key(engine):
    counter = iter(range(100))

    class Drifting(ToolEnv):
        def reset(self, row):
            return [{"role": "user", "content": f"{row['q']} #{next(counter)}"}]

    with EngineClient(engine) as client:
        loop = AgentLoop(client, char_tokenizer(), TEMPLATE, Drifting, LIMITS)
        with pytest.raises(ValueError, match="request 'q': the environment's reset gave its samples different "
                                             "prompts \\(2 of them\\)"):
            loop.run([RolloutRequest("q", [], SamplingParams(seed=1), n=2)], [{"q": "1+1?"}])
        with pytest.raises(ValueError, match="agent.max_turns must be >= 1, got 0"):
            AgentLoop(client, char_tokenizer(), TEMPLATE, ToolEnv, AgentLimits(max_turns=0))


def test_a_failing_environment_is_rerun_fresh_then_its_whole_group_is_excluded(engine):
    # the first environment made (q0's first sample) crashes; its rerun gets a fresh one that works
    made = []

    def first_one_fails():
        made.append(ToolEnv(fail_on="What is 0+0?" if not made else None))
        return made[-1]

    results, _, _ = rollout(engine, first_one_fails, limits=replace(LIMITS, env_retries=1))
    rerun = results[0].episodes[0]
    assert (rerun.retries, rerun.end_reason, rerun.error) == (1, "answer", "")
    assert not any(r.excluded for r in results) and len(made) == 9  # 8 episodes and one fresh environment
    # an environment that always fails: after the retry the group is out of the step, naming the error
    results, _, _ = rollout(engine, lambda: ToolEnv(fail_on="What is 1+2?"), limits=replace(LIMITS, env_retries=1))
    assert [bool(r.excluded) for r in results] == [False, True, False, False]
    assert results[1].excluded == ("env.step: RuntimeError('tool crashed on turn 1') (request q1, sample 0, after 1 "
                                   "retries)")
    assert [e.retries for e in results[1].episodes] == [1, 1]


def test_an_environment_past_its_timeout_fails_its_episode_and_the_run_goes_on(engine):
    slow = replace(LIMITS, env_timeout_s=0.3)
    began = time.perf_counter()
    results, _, _ = rollout(engine, lambda: ToolEnv(latency_s=3.0), limits=slow, requests=1, n=1)
    assert time.perf_counter() - began < 2.5  # the hung step was left behind, not waited for
    assert results[0].excluded.startswith("env.step: TimeoutError('env.step took longer than "
                                          "agent.env_timeout_s=0.3')")
