"""Hermes tool-call parsing and `ToolEnv` with the real tools: what the model's messages turn into, message by
message, and the counters a run logs."""

import json

import pytest

from rlinf_like.envs.text import TEXT_ENVS
from rlinf_like.envs.text.tool_calls import MalformedCall, ToolCall, final_text, parse_tool_calls
from rlinf_like.envs.text.tool_env import ToolEnv
from rlinf_like.envs.tools import TOOLS, Tool, ToolOptions


def hermes(name, arguments) -> str:
    """A call laid out as Qwen2.5 / Qwen3 chat templates render an assistant's tool_calls."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments) + "}\n</tool_call>"


# --- parsing --------------------------------------------------------------------------------------------------------

def test_parses_several_calls_and_the_text_around_them():
    message = ("I will compute, then look it up.\n" + hermes("calculator", {"expression": "6*7"}) + "\n"
               + hermes("search", {"query": "Mount Nylask flower"}) + "\nDone.")
    assert parse_tool_calls(message) == [ToolCall("calculator", {"expression": "6*7"}),
                                         ToolCall("search", {"query": "Mount Nylask flower"})]
    assert final_text(message) == "I will compute, then look it up.\n\n\nDone."
    assert parse_tool_calls("The answer is 42.") == [] and final_text("The answer is 42.") == "The answer is 42."
    assert parse_tool_calls('<tool_call>{"name": "python"}</tool_call>') == [ToolCall("python", {})]


@pytest.mark.parametrize("block, error", [
    ("{'name': 'python'}", "invalid JSON in <tool_call>: Expecting property name enclosed in double quotes: "
                           "line 1 column 2 (char 1)"),
    ('["python", {}]', 'a tool call must be a JSON object {"name": ..., "arguments": {...}}'),
    ('{"arguments": {"code": "1"}}', 'a tool call needs a "name" string'),
    ('{"name": "", "arguments": {}}', 'a tool call needs a "name" string'),
    ('{"name": "python", "arguments": "print(1)"}', "\"arguments\" of 'python' must be a JSON object, got str"),
    ('{"name": "shell", "arguments": {}}', "unknown tool 'shell'; available: ['calculator', 'python']"),
])
def test_malformed_calls_say_what_is_wrong(block, error):
    message = f"before <tool_call>\n{block}\n</tool_call> after"
    assert parse_tool_calls(message, known=["python", "calculator"]) == [MalformedCall(text=block, error=error)]
    assert final_text(message) == "before  after"


def test_an_unclosed_tag_is_malformed_after_the_complete_calls():
    message = hermes("python", {"code": "print(1)"}) + '\n<tool_call>\n{"name": "python", "argu'
    assert parse_tool_calls(message) == [
        ToolCall("python", {"code": "print(1)"}),
        MalformedCall(text='{"name": "python", "argu',
                      error="unclosed <tool_call> tag: end each call with </tool_call>")]
    assert final_text("Thinking. <tool_call>\n{") == "Thinking."


# --- the environment ----------------------------------------------------------------------------------------------

# the per-tool limit: the timeout case waits it out, and a python call must start and finish within it on a loaded
# 2-core machine (0.5 s once timed out there, with another test's workers starting beside it)
@pytest.fixture
def env():
    e = TEXT_ENVS.get("tools")(tools=["calculator", "search", "python"], options={"timeout_s": 2.0},
                               system_prompt="Use tools.", prompt_key="question")
    yield e
    e.close()


def test_built_from_the_registry_with_the_tools_schemas(env):
    assert isinstance(env, ToolEnv) and env.options == ToolOptions(timeout_s=2.0)
    assert [t["function"]["name"] for t in env.tools] == ["calculator", "search", "python"]
    assert env.tools[1] == TOOLS.get("search")(ToolOptions()).schema()
    with pytest.raises(ValueError, match=r"agent.tools='shell' is not one of \['calculator', 'python', 'search'\]"):
        ToolEnv(tools=["shell"], options=ToolOptions())


def test_reset_opens_with_the_system_prompt_and_the_rows_prompt(env):
    assert env.reset({"question": "Who founded Tysktril?", "answer": "Stelan"}) == [
        {"role": "system", "content": "Use tools."}, {"role": "user", "content": "Who founded Tysktril?"}]
    plain = ToolEnv(tools=["calculator"], options=ToolOptions())
    assert plain.reset({"prompt": "2+2?"}) == [{"role": "user", "content": "2+2?"}]
    with pytest.raises(KeyError, match=r"agent.prompt_key='prompt' is not a field of the task row; it has "
                                       r"\['question'\]"):
        plain.reset({"question": "2+2?"})


def test_a_message_without_calls_ends_the_episode_as_the_answer(env):
    env.reset({"question": "q"})
    step = env.step("The answer is Stelan.")
    assert (step.messages, step.done, step.end_reason, step.reward) == (None, True, "answer", 0.0)
    assert step.info == {"tool_calls": 0, "malformed_calls": 0, "tool_errors": 0, "tool_timeouts": 0}


def test_each_call_runs_and_answers_with_one_tool_message_in_order(env):
    env.reset({"question": "q"})
    step = env.step("Let me check.\n" + hermes("calculator", {"expression": "123*45"}) + "\n"
                    + hermes("search", {"query": "Tysktril founded"}) + "\n" + hermes("python", {"code": "print(2+3)"}))
    assert not step.done and step.end_reason == ""
    assert [(m["role"], m["name"]) for m in step.messages] == [("tool", "calculator"), ("tool", "search"),
                                                              ("tool", "python")]
    assert step.messages[0]["content"] == "5535" and step.messages[2]["content"] == "5\n"
    assert step.messages[1]["content"].startswith("Tysktril: Tysktril is a market town in the Fennagh lowlands. It "
                                                  "was founded in 1300 by a cooper named Stelan.")
    assert step.info == {"tool_calls": 3, "malformed_calls": 0, "tool_errors": 0, "tool_timeouts": 0}


def test_malformed_calls_errors_and_timeouts_are_shown_to_the_model_and_counted(env):
    env.reset({"question": "q"})
    step = env.step(hermes("calculator", {"expression": "1/0"}) + '<tool_call>{"name": "shell"}</tool_call>'
                    + hermes("python", {"code": "while True: pass"}) + "<tool_call>{not json}</tool_call>")
    assert step.messages == [
        {"role": "tool", "name": "calculator", "content": "error: division by zero"},
        {"role": "tool", "name": "", "content": "error: malformed tool call: unknown tool 'shell'; available: "
                                                "['calculator', 'python', 'search']"},
        {"role": "tool", "name": "python", "content": "error: the code timed out after 2 s and was stopped"},
        {"role": "tool", "name": "", "content": "error: malformed tool call: invalid JSON in <tool_call>: Expecting "
                                                "property name enclosed in double quotes: line 1 column 2 (char 1)"}]
    assert step.info == {"tool_calls": 2, "malformed_calls": 2, "tool_errors": 1, "tool_timeouts": 1}
    assert step.done and step.end_reason == "tool_timeout"  # the per-tool time limit ends the episode, named
    env.step(hermes("calculator", {"expression": "2+2"}))
    assert env.totals == {"tool_calls": 3, "malformed_calls": 2, "tool_errors": 1, "tool_timeouts": 1}
    env.reset({"question": "q"})
    assert env.totals == {"tool_calls": 0, "malformed_calls": 0, "tool_errors": 0, "tool_timeouts": 0}


class BrokenTool(Tool):
    name = "broken"
    closed = 0

    def run(self, arguments):
        raise RuntimeError(f"bug with {arguments}")

    def close(self):
        BrokenTool.closed += 1


@pytest.fixture
def broken_tool():
    TOOLS.register("broken")(BrokenTool)
    yield
    TOOLS.unregister("broken")


def test_an_exception_inside_a_tool_is_an_error_message_not_a_crash(broken_tool):
    env = ToolEnv(tools=["broken"], options=ToolOptions(max_calls_per_turn=2))
    env.reset({"prompt": "p"})
    step = env.step(hermes("broken", {"x": 1}) * 3)
    assert [m["content"] for m in step.messages] == [
        "error: RuntimeError: bug with {'x': 1}", "error: RuntimeError: bug with {'x': 1}",
        "error: not run: at most 2 tool calls are run per message"]
    assert step.info == {"tool_calls": 2, "malformed_calls": 0, "tool_errors": 3, "tool_timeouts": 0}
    env.close()
    assert BrokenTool.closed == 1
