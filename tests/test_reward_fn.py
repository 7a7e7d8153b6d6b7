"""Reward functions (`reward.fn`): the built-in `math` reward with the real math-verify, `exact`, a
user's `module:function`, the time limit and error value, and the config checks."""

import logging
import os
import sys
import textwrap
import threading
import time

import pytest

from rlinf_like.workers.reward import RewardConfig, score
from rlinf_like.workers.reward.builtin import exact_reward, extract_final_answer, math_equal, math_reward
from rlinf_like.workers.reward.combine import check_reward_config
from rlinf_like.workers.reward.fn import call_with_timeout, load_reward_fn, score_sample, to_sample_score

REWARD_NAMES = r"\['auto', 'exact', 'ifeval', 'ifeval_all', 'judge', 'math', 'reasoning_gym'\]"  # the registry, sorted

# (response, reference, what the original matcher said): each must be correct under `math`
EQUIVALENT = [
    ("so \\boxed{\\dfrac{1}{2}}", "0.5", False),
    ("\\boxed{x=3}", "3", False),
    ("\\boxed{50\\%}", "0.5", False),
    ("\\boxed{\\{1,2\\}}", "\\{2,1\\}", False),
    ("\\boxed{1,234}", "1234", True),
    ("\\boxed{\\frac{3}{4}}", "0.75", True),
    ("6 * 7 = 42\n#### 42", "42", False),  # GSM8K's own answer line: the old matcher found no answer
]


@pytest.mark.parametrize("response,reference,old", EQUIVALENT)
def test_math_reward_accepts_equivalent_answers_the_old_matcher_did_or_did_not(response, reference, old):
    new = math_reward(response, reference, finished=True, num_tokens=10)
    assert new == {"reward": 1.0, "correct": True, "formatted": True}
    assert score(response, reference, finished=True, num_tokens=10).correct is old


def test_math_reward_runs_in_a_worker_thread():
    """math-verify's own timeouts use signal.alarm, which raises outside the main thread."""
    out = {}
    thread = threading.Thread(target=lambda: out.update(math_reward("\\boxed{\\dfrac{1}{2}}", "0.5")))
    thread.start()
    thread.join(60)
    assert out["correct"] is True


@pytest.mark.parametrize("predicted,reference", [
    ("7", "-7"), ("\\frac{1}{3}", "0.33"), ("cat", "act"), ("7 dollars", "7"), ("x=4", "3"), ("(1,2)", "(2,1)"),
])
def test_math_equal_refuses_different_answers(predicted, reference):
    assert not math_equal(predicted, reference)


@pytest.mark.parametrize("response", [
    "Answer: 7", "Answer: 8", "no idea", "\\boxed{7}", "\\boxed{07}", "Answer: 7.0", "Answer: 7 dollars",
    "answer：7 ", "\\boxed{7} then Answer: 8", "Answer: $7.", "Answer: 7/1", "\\boxed{unclosed", "Answer: -7",
])
@pytest.mark.parametrize("finished,num_tokens", [(True, 9), (False, 3)])
def test_math_reward_scores_arithmetic_answers_as_the_original_rules(response, finished, num_tokens):
    """The arithmetic task's rewards (plain numbers) are unchanged, format credit and penalties included."""
    config = RewardConfig(correct=1.0, format=0.1, no_eos_penalty=0.5, min_response_tokens=5, short_penalty=0.2)
    old = score(response, "7", finished, num_tokens, config)
    new = math_reward(response, "7", config=config, finished=finished, num_tokens=num_tokens)
    assert (new["reward"], new["correct"], new["formatted"]) == (old.total, old.correct, old.formatted)


def test_math_verifys_timeout_warning_is_not_shown(caplog):
    """math-verify warns once per process from its parser and once from its grader that its timeouts are off (we
    turn them off: `reward.timeout_s` limits the call): noise in every run's console, dropped."""
    import math_verify.grader
    import math_verify.parser

    math_verify.parser.TIMEOUT_WARNING_SHOWN = math_verify.grader.TIMEOUT_WARNING_SHOWN = False  # as in a new process
    with caplog.at_level(logging.WARNING):
        assert math_equal("\\dfrac{1}{2}", "\\frac{2}{4}")  # both parsed and compared by math-verify
    assert not [r for r in caplog.records if "Timeout is disabled" in r.getMessage()]


def test_math_verify_drops_known_units():
    """A deliberate change: math-verify reads "12 apples" as 12 (the old matcher compared strings)."""
    assert math_equal("12 apples", "12") and not score("Answer: 12 apples", "12", True, 9).correct


@pytest.mark.parametrize("text,answer", [
    ("#### 42", "42"), ("Answer: 3\n#### 42", "42"), ("#### 42\nAnswer: 3", "3"), ("#### 1 \\boxed{5}", "5"),
    ("####", None), ("work\n#### 1,234\n", "1,234"),
])
def test_extract_final_answer(text, answer):
    assert extract_final_answer(text) == answer


def test_exact_reward_is_normalised_string_equality():
    assert exact_reward("Answer: Paris.", "paris")["correct"]
    assert exact_reward("\\boxed{ New  York }", "new york")["reward"] == 1.0
    assert exact_reward("Answer: 0.5", "1/2") == {"reward": 0.1, "correct": False, "formatted": True}


USER_MODULE = """
    import time

    def as_float(response, answer, **info):
        return 1.0 if answer in response and info["finished"] else 0.25

    def as_dict(response, answer, **info):
        return {"reward": 0.5, "length": info["num_tokens"], "prompt_chars": len(info["prompt"]), "note": "kept out"}

    def correct_flag(response, answer, **info):
        return {"reward": 0.2, "correct": True}

    def raises(response, answer, **info):
        raise RuntimeError("bad reward")

    def sleeps(response, answer, **info):
        time.sleep(5)
        return 1.0

    def no_reward(response, answer, **info):
        return {"score": 1.0}

    def not_finite(response, answer, **info):
        return float("nan")

    not_a_function = 3
"""


@pytest.fixture(scope="module")
def user_module(tmp_path_factory):
    """A reward module written to a temporary folder on sys.path, as a user's own would be."""
    folder = tmp_path_factory.mktemp("user_rewards")
    (folder / "my_rewards_tmp.py").write_text(textwrap.dedent(USER_MODULE))
    sys.path.insert(0, str(folder))
    yield "my_rewards_tmp"
    sys.path.remove(str(folder))
    sys.modules.pop("my_rewards_tmp", None)


def user_score(module, name, **config):
    cfg = RewardConfig(fn=f"{module}:{name}", **config)
    return score_sample(load_reward_fn(cfg), cfg, "s3-1", "so 42", "42", prompt="6*7=", finished=True, num_tokens=4)


def test_a_user_function_returning_a_float(user_module):
    s = user_score(user_module, "as_float")
    assert (s.reward, s.correct, s.formatted, s.extras) == (1.0, True, True, {})


def test_a_user_function_returning_a_dict_keeps_its_numbers_as_extras(user_module):
    s = user_score(user_module, "as_dict")
    assert (s.reward, s.correct, s.extras) == (0.5, False, {"length": 4.0, "prompt_chars": 4.0})
    assert user_score(user_module, "correct_flag").correct is True  # the dict's own flag wins


@pytest.mark.parametrize("name,config,error", [
    ("raises", {}, "RuntimeError: bad reward"),
    ("sleeps", {"timeout_s": 0.2}, "TimeoutError: no result within reward.timeout_s=0.2"),
    ("no_reward", {}, "a reward dict must hold 'reward'"),
    ("not_finite", {}, "the reward must be a finite number, got nan"),
])
def test_a_failing_user_function_scores_error_value_and_is_logged(user_module, caplog, name, config, error):
    with caplog.at_level(logging.WARNING, logger="rlinf_like.workers.reward.fn"):
        s = user_score(user_module, name, error_value=-1.0, **config)
    assert (s.reward, s.correct, s.formatted) == (-1.0, False, False)
    [record] = caplog.records
    assert f"reward.fn={user_module}:{name} failed on request s3-1" in record.getMessage()
    assert error in record.getMessage()


def test_numpy_numbers_are_numbers():
    import numpy as np

    s = to_sample_score({"reward": np.float32(0.5), "depth": np.int64(3)}, RewardConfig())
    assert (s.reward, s.extras) == (0.5, {"depth": 3.0})


def test_call_with_timeout_returns_and_reraises():
    assert call_with_timeout(lambda a, b=0: a + b, 5, 1, b=2) == 3
    with pytest.raises(ZeroDivisionError):
        call_with_timeout(lambda: 1 / 0, 5)


def test_call_with_timeout_reuses_one_thread_and_replaces_a_hung_one():
    """A step's calls share one thread (a thread each made 256 calls ~2-3x slower); a call that hangs
    keeps its thread, and the next call runs at once on a fresh one instead of queueing behind it."""
    threads = {call_with_timeout(threading.current_thread, 5) for _ in range(50)}
    assert len(threads) == 1 and threading.current_thread() not in threads
    release = threading.Event()
    with pytest.raises(TimeoutError):
        call_with_timeout(release.wait, 0.1)
    start = time.perf_counter()
    after = call_with_timeout(threading.current_thread, 5)
    assert time.perf_counter() - start < 1.0 and after not in threads
    [hung] = threads  # the thread the 50 calls shared took the call that hung
    release.set()
    hung.join(timeout=5)  # the abandoned thread ends once its late call returns, not idles for the process's life
    assert not hung.is_alive()
    call_with_timeout(threading.current_thread, 5)
    from rlinf_like.workers.reward import fn

    assert all(r.thread.is_alive() for r in fn._started)  # and is no longer listed


@pytest.mark.parametrize("change,message", [
    (dict(fn="maths"), r"reward.fn='maths' is not one of " + REWARD_NAMES),
    (dict(fn="no_such_module_xyz:f"), r"reward.fn='no_such_module_xyz:f' cannot be loaded \(ModuleNotFoundError.*"
                                      r"give one of " + REWARD_NAMES + r" or module:function"),
    (dict(fn="os:no_such_function"), r"reward.fn='os:no_such_function' cannot be loaded \(AttributeError"),
    (dict(fn="os:sep"), r"reward.fn='os:sep' is a str, not a function"),
    (dict(timeout_s=0.0), r"reward.timeout_s must be > 0"),
    (dict(error_value=float("nan")), r"reward.error_value must be finite"),
])
def test_bad_reward_fn_config_is_named(change, message):
    with pytest.raises(ValueError, match=message):
        check_reward_config(RewardConfig(**change))


def test_reward_fn_is_imported_in_the_reward_worker(cluster, tmp_path):
    """`reward.fn=module:function` through a real Ray worker: the function runs in the worker process."""
    from transformers import AutoTokenizer

    from rlinf_like.models.tiny import write_tiny_model
    from rlinf_like.workers.reward.worker import RewardWorker
    from rlinf_like.workers.rollout.types import RolloutResult

    path = str(write_tiny_model(tmp_path / "model"))
    tok = AutoTokenizer.from_pretrained(path)
    right, wrong = tok("so 3").input_ids, tok("so 4").input_ids
    result = RolloutResult("r7", tok("1+2=").input_ids, [right, wrong], [[0.0] * len(right), [0.0] * len(wrong)],
                           ["stop", "length"])
    cfg = RewardConfig(fn="user_rewards:where_scored")
    group = RewardWorker.create_group(path, cfg).launch(cluster, cluster.place({"reward": "0"}), "reward",
                                                      init_process_group=False)
    try:
        [[a, b]] = group.score([result], ["3"], [{"level": 2, "prompt": "a column named prompt"}]).wait(timeout=120)[0]
    finally:
        group.shutdown()
    assert (a.reward, b.reward, a.correct, b.correct) == (1.0, 0.0, True, False)
    assert a.extras["pid"] != os.getpid()  # imported and called in the worker's process
    assert (a.extras["num_tokens"], b.extras["num_tokens"], a.extras["level"]) == (len(right), len(wrong), 2.0)


def test_extras_become_step_metrics_averaged_over_the_samples_that_carry_them():
    from rlinf_like.runners.reasoning.phases import extra_metrics
    from rlinf_like.workers.reward.types import SampleScore

    samples = [SampleScore(reward=1.0, correct=True, formatted=True, extras={"length": 4.0, "steps": 1.0}),
               SampleScore(reward=0.0, correct=False, formatted=False),  # e.g. a failed call: no extras
               SampleScore(reward=0.5, correct=False, formatted=True, extras={"length": 8.0})]
    assert extra_metrics(samples) == {"reward/length": 6.0, "reward/steps": 1.0}
    assert extra_metrics(samples[1:2]) == {}


def test_reward_fn_overrides_through_hydra_and_is_checked_before_launch(tmp_path):
    """`reward.fn=module:function` on the command line (a colon parses), refused before launch when unknown."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema, structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runners.reasoning import check_config

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    config_dir = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "config"
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        good, bad = (structure(ReasoningConfig, compose("grpo_collocated", [f"reward.fn={fn}", "reward.timeout_s=2.5",
                                                                             f"runner.output_dir={tmp_path}"]))
                     for fn in ("user_rewards:where_scored", "maths"))
    assert (good.reward.fn, good.reward.timeout_s) == ("user_rewards:where_scored", 2.5)
    check_config(good)
    with pytest.raises(ValueError, match=r"reward.fn='maths' is not one of " + REWARD_NAMES):
        check_config(bad)


def test_row_columns_reach_the_reward_except_reserved_names():
    """A column named `config` would replace the built-ins' RewardConfig (every sample would score
    error_value); `response` / `answer` would clash with the positional arguments; `prompt` is the rendered one."""
    from rlinf_like.workers.reward.worker import reward_info

    info = reward_info({"level": 3, "config": "x", "answer": "7", "response": "r", "prompt": "raw"}, "rendered", True, 5)
    assert info == {"level": 3, "prompt": "rendered", "finished": True, "num_tokens": 5}
    assert math_reward("\\boxed{7}", "7", **info)["correct"]


# the format rate: responses whose final answer the reward function found (parsed), right or wrong
MATH_FORMAT = [  # (response, reference, parsed, correct)
    ("2 + 2 = \\boxed{4}", "4", True, True),
    ("6 * 7 = 42\n#### 41", "42", True, False),  # GSM8K's answer line, wrong
    ("so the Answer: 7", "7", True, True),
    ("it is 4, I think", "4", False, False),  # a right number, but no final-answer format
    ("\\boxed{4", "4", False, False),  # never closes
]
RG_FORMAT = [  # reasoning_gym: the <answer> tag, else what math would extract
    ("<answer>9</answer>", "9", True, True),
    ("<answer>8</answer>", "9", True, False),
    ("nine", "9", False, False),
]


@pytest.mark.parametrize("fn,cases,info", [
    ("math", MATH_FORMAT, {}),
    ("reasoning_gym", RG_FORMAT, {"metadata": {"source_dataset": "chain_sum"}}),
])
def test_format_rate_is_the_share_of_responses_with_a_parsed_answer(fn, cases, info):
    """eval_metrics reads `SampleScore.formatted`, which each built-in sets where its extractor found an answer:
    one definition of "parsed" for the held-out evaluation and the training steps' train_format_rate."""
    from rlinf_like.runners.reasoning.phases import eval_metrics

    if fn == "reasoning_gym":
        pytest.importorskip("reasoning_gym")
    config = RewardConfig(fn=fn)
    groups = [[score_sample(load_reward_fn(config), config, f"r{i}", response, answer, **info)]
              for i, (response, answer, _, _) in enumerate(cases)]
    assert [g[0].formatted for g in groups] == [parsed for *_, parsed, _ in cases]
    assert [g[0].correct for g in groups] == [correct for *_, correct in cases]
    n = len(cases)
    assert eval_metrics(groups) == {"eval_accuracy": sum(c for *_, c in cases) / n,
                                    "eval_format_rate": sum(p for *_, p, _ in cases) / n}
    assert eval_metrics(groups)["eval_format_rate"] == {"math": 3 / 5, "reasoning_gym": 2 / 3}[fn]
