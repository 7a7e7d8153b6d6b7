"""The OpenAI-compatible endpoint over the native engine, through the real `openai` client on localhost:
what it returns equals what the engine samples, sessions record the engine's exact ids, bad requests are
400s naming the field, and agent programs run end to end."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from examples.agentic.openai_agent import calculate, next_step
from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.agentic.agent_program import resolve_program, run_programs
from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer, SessionCall, session_trajectories

MAX_CONTEXT = 1024
MODEL = "tiny-chat"
# ChatML-like, turns ended by the tokenizer's <eos> (the tiny char model ships no template)
TEMPLATE = ("{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}"
            "<eos>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<eos>\n"
            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HELLO = [{"role": "user", "content": "What is 2+3?"}]


class LockedEngine:
    """A thread-safe `submit` over the engine for tests: one generate at a time, in a pool thread."""

    def __init__(self, engine):
        self.engine, self.lock, self.pool = engine, threading.Lock(), ThreadPoolExecutor(4)

    def submit(self, request: RolloutRequest):
        return self.pool.submit(self._run, request)

    def _run(self, request):
        with self.lock:
            return self.engine.generate([request])[0]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(max_position_embeddings=MAX_CONTEXT)))
    tokenizer = load_tokenizer(path)
    engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=8), tokenizer=tokenizer)
    server = OpenAIServer(LockedEngine(engine).submit, tokenizer, TEMPLATE, MODEL, MAX_CONTEXT)
    server.start()
    yield server, engine, tokenizer
    server.close()


def client(server, session_id):
    return openai.OpenAI(base_url=server.base_url(session_id), api_key="x", max_retries=0)


def render(tokenizer, messages, tools=None):
    return tokenizer.apply_chat_template(messages, tools=tools, chat_template=TEMPLATE, add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def engine_sample(engine, prompt_ids, params, n=1):
    return engine.generate([RolloutRequest("ref", prompt_ids, params, n)])[0]


def test_chat_greedy_equals_engine_and_records_its_ids(setup):
    server, engine, tokenizer = setup
    reply = client(server, "greedy").chat.completions.create(model="any-name", messages=HELLO, temperature=0,
                                                              max_tokens=20, logprobs=True)
    [call] = server.pop_session("greedy")
    prompt = render(tokenizer, HELLO)
    reference = engine_sample(engine, prompt, SamplingParams(max_new_tokens=20, temperature=0.0))
    assert call.prompt_ids == prompt
    assert call.response_ids == reference.response_ids[0]
    assert call.logprobs == reference.logprobs[0] and call.finish_reason == reference.finish_reasons[0]
    choice = reply.choices[0]
    assert choice.message.content == tokenizer.decode(call.response_ids, skip_special_tokens=True)
    assert choice.finish_reason == call.finish_reason
    assert [t.logprob for t in choice.logprobs.content] == call.logprobs  # the exact floats, through JSON
    assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([i]) for i in call.response_ids]
    assert reply.model == MODEL
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (len(prompt), len(call.response_ids))


def test_chat_sampling_follows_seed_n_and_tools(setup):
    server, engine, tokenizer = setup
    tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
    reply = client(server, "sampled").chat.completions.create(
        model=MODEL, messages=HELLO, tools=tools, temperature=0.9, top_p=0.95, seed=7, n=3, max_completion_tokens=12)
    calls = server.pop_session("sampled")
    prompt = render(tokenizer, HELLO, tools)
    assert "Tools: calc" in tokenizer.decode(prompt)
    reference = engine_sample(engine, prompt, SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.95, seed=7), 3)
    assert [c.prompt_ids for c in calls] == [prompt] * 3
    assert [c.response_ids for c in calls] == reference.response_ids
    assert len({tuple(c.response_ids) for c in calls}) > 1  # the samples differ: n samples, not one copied
    assert [c.message.content for c in reply.choices] == [tokenizer.decode(c.response_ids, skip_special_tokens=True)
                                                         for c in calls]
    assert reply.usage.completion_tokens == sum(len(c.response_ids) for c in calls)


def test_completions_from_text_or_ids_and_stop_strings(setup):
    server, engine, tokenizer = setup
    api = client(server, "completions")
    prompt = tokenizer("12+34=").input_ids
    by_text = api.completions.create(model=MODEL, prompt="12+34=", max_tokens=16, temperature=0, logprobs=0)
    by_ids = api.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    reference = engine_sample(engine, prompt, SamplingParams(max_new_tokens=16, temperature=0.0))
    text = tokenizer.decode(reference.response_ids[0], skip_special_tokens=True)
    assert by_text.choices[0].text == by_ids.choices[0].text == text
    assert by_text.choices[0].logprobs.token_logprobs == reference.logprobs[0]
    # stop at a character the greedy text has: the text ends before it, the tokens run up to it
    cut = next(i for i, ch in enumerate(text) if i >= 3 and ch not in text[:i])
    stopped = api.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stop=[text[cut]])
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == (text[:cut], "stop")
    calls = server.pop_session("completions")
    assert [c.prompt_ids for c in calls] == [prompt] * 3
    assert calls[2].response_ids == reference.response_ids[0][: cut + 1]


def test_sessions_are_isolated_and_closed_by_pop(setup):
    server, engine, tokenizer = setup
    questions = {f"s{i}": [{"role": "user", "content": f"question {i}"}] for i in range(4)}

    def ask(session_id):
        api = client(server, session_id)
        for _ in range(2):
            api.chat.completions.create(model=MODEL, messages=questions[session_id], max_tokens=4, temperature=1.0)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(ask, questions))
    for session_id, messages in questions.items():
        assert [c.prompt_ids for c in server.calls(session_id)] == [render(tokenizer, messages)] * 2
    api = client(server, "s0")
    assert len(server.pop_session("s0")) == 2 and server.calls("s0") == []
    with pytest.raises(openai.NotFoundError, match="session 's0' is not open"):
        api.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4)
    assert [m.id for m in api.models.list().data] == [MODEL]
    bare = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0)
    reply = bare.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=3, temperature=0)
    greedy = engine_sample(engine, render(tokenizer, HELLO), SamplingParams(max_new_tokens=3, temperature=0.0))
    assert reply.choices[0].message.content == tokenizer.decode(greedy.response_ids[0], skip_special_tokens=True)
    assert all(len(server.calls(s)) == 2 for s in ("s1", "s2", "s3"))  # served, recorded in no session


@pytest.mark.parametrize("kwargs, param, words", [
    (dict(extra_body={"foo": 1}), "foo", "Unrecognized request argument supplied: foo"),
    (dict(temperature=-1), "temperature", "greater than or equal to 0"),
    (dict(logprobs=True, top_logprobs=3), "top_logprobs", "top_logprobs=3 is not supported"),
    (dict(presence_penalty=0.5), "presence_penalty", "presence_penalty=0.5"),
    (dict(n=0), "n", "greater than or equal to 1"),
    (dict(stop=[""]), "stop", "empty stop string"),
    (dict(messages=[{"role": "robot", "content": "hi"}]), "messages[0].role", "must be one of"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content", "only text"),
    (dict(messages=[{"role": "user", "content": "x" * 2000}]), "messages",
     "context length is 1024 tokens, but the prompt has 2041 tokens"),
    (dict(max_tokens=1000), "max_tokens",
     "1053 were requested (53 in the prompt, 1000 for the completion); lower max_tokens to at most 971"),
    (dict(n=9), None, "n must be in 1..8"),
])
def test_bad_chat_requests_are_400s_naming_the_field(setup, kwargs, param, words):
    server, _, _ = setup
    request = dict(model=MODEL, messages=HELLO, max_tokens=4) | kwargs
    with pytest.raises(openai.BadRequestError) as error:
        client(server, "bad").chat.completions.create(**request)
    assert error.value.status_code == 400 and error.value.param == param
    assert words in error.value.message
    assert server.pop_session("bad") == []


def test_bad_completion_requests_and_bodies_are_400s(setup):
    server, _, _ = setup
    api = client(server, "bad-completions")
    for kwargs, param in [(dict(prompt=["a", "b"]), "prompt"), (dict(prompt=[1, 10**6]), "prompt"),
                          (dict(prompt="a", logprobs=2), "logprobs"), (dict(prompt="a", echo=True), "echo")]:
        with pytest.raises(openai.BadRequestError) as error:
            api.completions.create(model=MODEL, **kwargs)
        assert error.value.param == param, kwargs
    response = httpx.post(f"{server.base_url('bad-completions')}/chat/completions", content=b"{not json")
    assert response.status_code == 400 and "not a valid JSON object" in response.json()["error"]["message"]
    response = httpx.post(f"{server.base_url('bad-completions')}/chat/completions", json={"messages": HELLO})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "model")


def call(prompt, response, logprobs=None, reason="stop", version=0):
    return SessionCall(prompt_ids=prompt, response_ids=response, logprobs=logprobs or [-0.5] * len(response),
                       finish_reason=reason, version=version)


def test_session_trajectories_merge_calls_that_resend_the_conversation():
    first = call([1, 2, 3], [4, 5], [-0.1, -0.2], version=3)
    second = call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3], reason="length", version=2)  # 6, 7: a tool result
    [trajectory] = session_trajectories([first, second])
    assert trajectory.prompt_ids == [1, 2, 3]
    assert trajectory.response_ids == [4, 5, 6, 7, 8]
    assert trajectory.response_mask == [1, 1, 0, 0, 1]
    assert trajectory.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (trajectory.finish_reason, trajectory.version, trajectory.num_calls) == ("length", 2, 2)


def test_session_trajectories_split_calls_that_do_not_extend():
    first = call([1, 2, 3], [4, 5])
    rewritten = call([1, 2, 9, 4, 5, 6], [7])  # the history changed: not an extension
    side = call([20], [21])
    back = call([1, 2, 3, 4, 5, 6], [7, 8])  # continues the first, after an unrelated call
    trajectories = session_trajectories([first, rewritten, side, back])
    assert [(t.prompt_ids, t.response_ids, t.response_mask) for t in trajectories] == [
        ([1, 2, 3], [4, 5, 6, 7, 8], [1, 1, 0, 1, 1]), ([1, 2, 9, 4, 5, 6], [7], [1]), ([20], [21], [1])]


def two_turn_program(base_url, row):
    """A multi-turn agent: asks, sends a tool result back, asks again."""
    api = openai.OpenAI(base_url=base_url, api_key="x", max_retries=0)
    messages = [{"role": "user", "content": row["question"]}]
    first = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "tool", "content": "RESULT: 5"}]
    api.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    return 0.5


def failing_program(base_url, row):
    raise ValueError(f"no tool for {row['question']}")


def slow_program(base_url, row):
    time.sleep(5)
    return 1.0


def test_multi_turn_program_gives_one_trajectory_with_exact_ids(setup):
    server, _, tokenizer = setup
    [result] = run_programs(two_turn_program, server, [{"question": "What is 2+3?"}], 1, timeout_s=20)
    assert (result.reward, result.error) == (0.5, None)
    first, second = result.calls
    content = tokenizer.decode(first.response_ids, skip_special_tokens=True)
    assert second.prompt_ids == render(tokenizer, [*HELLO, {"role": "assistant", "content": content},
                                                   {"role": "tool", "content": "RESULT: 5"}])
    [trajectory] = result.trajectories
    inserted = second.prompt_ids[len(first.prompt_ids) + len(first.response_ids):]
    assert tokenizer.decode(inserted).endswith("<|im_start|>tool\nRESULT: 5<eos>\n<|im_start|>assistant\n")
    assert trajectory.prompt_ids == first.prompt_ids
    assert trajectory.response_ids == first.response_ids + inserted + second.response_ids
    mask = [1] * len(first.response_ids) + [0] * len(inserted) + [1] * len(second.response_ids)
    assert trajectory.response_mask == mask
    assert trajectory.logprobs == first.logprobs + [0.0] * len(inserted) + second.logprobs
    assert server.calls(result.session_id) == []  # its session was closed


def test_example_agent_runs_end_to_end(setup):
    server, _, _ = setup
    program = resolve_program("examples.agentic.openai_agent:solve")
    rows = [{"prompt": "What is 6*7?", "answer": "42"}, {"prompt": "What is 2+3?", "answer": "5"}]
    results = run_programs(program, server, rows, samples_per_row=2, timeout_s=20)
    assert [(r.row_index, r.sample_index, r.error) for r in results] == [(0, 0, None), (0, 1, None), (1, 0, None),
                                                                         (1, 1, None)]
    assert len({r.session_id for r in results}) == 4
    for result in results:
        assert result.reward in (0.0, 1.0) and result.calls and result.trajectories
        assert sum(sum(t.response_mask) for t in result.trajectories) == sum(len(c.response_ids) for c in result.calls)


def test_example_agent_tools():
    assert calculate("2*(3+4) - 10/4") == 11.5
    assert next_step("let me see\nCALC: 6*7\n") == ("tool", "RESULT: 42")
    kind, message = next_step("CALC: __import__('os')")
    assert kind == "tool" and message.startswith("ERROR: not arithmetic")
    assert next_step("ANSWER: 42") == ("answer", "42")
    assert next_step("no idea") == ("none", "")


def test_failing_and_slow_programs_get_reward_zero_and_their_error(setup):
    server, _, _ = setup

    def mixed(base_url, row):
        programs = {"fail": failing_program, "slow": slow_program, "ok": two_turn_program,
                    "no number": lambda base_url, row: "yes",
                    "dict": lambda base_url, row: {"reward": 0.25, "formatted": True}}
        return programs[row["kind"]](base_url, row)

    rows = [{"kind": kind, "question": f"Q{i}"} for i, kind in enumerate(["fail", "slow", "ok", "no number", "dict"])]
    began = time.monotonic()
    results = run_programs(mixed, server, rows, samples_per_row=1, timeout_s=2)
    assert time.monotonic() - began < 4
    assert [(r.reward, r.error) for r in results] == [
        (0.0, "ValueError: no tool for Q0"), (0.0, "timed out after 2 s"), (0.5, None),
        (0.0, "TypeError: the program must return a finite number (the reward), or a dict with one under 'reward', "
              "got 'yes'"), (0.25, None)]
    assert [r.formatted for r in results] == [False, False, False, False, True]  # a bare 0.5: formatted only at 1
    assert len(results[2].calls) == 2 and results[0].calls == []


def test_resolve_program_names_the_key():
    with pytest.raises(ValueError, match=r"agent.program='no_such_module:f': module 'no_such_module' cannot be"):
        resolve_program("no_such_module:f")
    with pytest.raises(ValueError, match=r"agent.program='examples.agentic.openai_agent:nope': .* has no 'nope'"):
        resolve_program("examples.agentic.openai_agent:nope")
    with pytest.raises(ValueError, match=r"cannot be called as \(base_url, row\)"):
        resolve_program("examples.agentic.openai_agent:next_step")
    with pytest.raises(ValueError, match="give module:function"):
        resolve_program("solve")


def test_streamed_chat_equals_the_whole_answer(setup):
    """verifiers' chat harness (and many agents) always stream: the events carry the same text and usage."""
    server, _, _ = setup
    whole = client(server, "whole").chat.completions.create(model=MODEL, messages=HELLO, temperature=0, max_tokens=9)
    stream = client(server, "stream").chat.completions.create(
        model=MODEL, messages=HELLO, temperature=0, max_tokens=9, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert server.pop_session("stream")[0].response_ids == server.pop_session("whole")[0].response_ids


class Scripted:
    """A `submit` that answers each call with the next scripted text's token ids (what a trained model would
    sample): the endpoint's parsing and re-rendering are what is under test here."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, list(texts)

    def submit(self, request: RolloutRequest):
        from concurrent.futures import Future

        from rlinf_like.workers.rollout import RolloutResult

        ids = self.tokenizer(self.texts.pop(0)).input_ids + [self.tokenizer.eos_token_id]
        future = Future()
        future.set_result(RolloutResult(request.request_id, list(request.prompt_ids), [ids], [[-0.5] * len(ids)],
                                        ["stop"]))
        return future


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_come_back_parsed_and_render_as_sampled(setup, stream):
    """A Hermes block in the sampled text is a `tool_calls` entry; sent back, that message renders to the very
    tokens the engine sampled (not the template's rendering of `tool_calls`), so the session is one trajectory."""
    _, _, tokenizer = setup
    call_text = 'Let me compute.<tool_call> {"name": "calc", "arguments": {"expression": "2+3"}} </tool_call>'
    server = OpenAIServer(Scripted(tokenizer, [call_text, "It is 5."]).submit, tokenizer, TEMPLATE, MODEL, MAX_CONTEXT)
    server.start()
    try:
        tools = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
        chat = client(server, "tools").chat.completions
        first = chat.create(model=MODEL, messages=HELLO, tools=tools, stream=stream)
        if stream:
            chunks = [c.choices[0] for c in first if c.choices]
            calls, reason = chunks[0].delta.tool_calls, chunks[-1].finish_reason
            message = {"role": "assistant", "content": chunks[0].delta.content,
                       "tool_calls": [{"id": c.id, "type": "function",
                                       "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                      for c in calls]}
        else:
            calls, reason = first.choices[0].message.tool_calls, first.choices[0].finish_reason
            message = first.choices[0].message.model_dump(exclude_none=True)
        assert reason == "tool_calls" and message["content"] == "Let me compute."
        assert [(c.function.name, c.function.arguments) for c in calls] == [("calc", '{"expression": "2+3"}')]
        follow = HELLO + [message, {"role": "tool", "tool_call_id": calls[0].id, "content": "5"}]
        chat.create(model=MODEL, messages=follow, tools=tools, stream=stream)
        recorded = server.pop_session("tools")
        [trajectory] = session_trajectories(recorded)  # the second prompt extends the first call's exact ids
        assert trajectory.num_calls == 2
        assert trajectory.response_ids[: len(recorded[0].response_ids)] == recorded[0].response_ids
    finally:
        server.close()
