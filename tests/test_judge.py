"""LLM-judge rewards (`reward.fn=judge`): verdict parsers, the judge's prompt, one engine call per step for our
own judge, a remote judge reached through our own OpenAI-compatible endpoint, unparseable and dead judges scoring
`reward.error_value` (named in the log), and 2-step runs with each judge."""

import logging
import socket

import pytest

from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning import check_config, train
from rlinf_like.workers.reward.judge import JudgeConfig, judge_reward, parse_number, parse_yes_no, render
from rlinf_like.workers.reward.judge_worker import JudgeWorker
from rlinf_like.workers.reward.rules import RewardConfig
from rlinf_like.workers.rollout import RolloutConfig, RolloutResult, make_engine
from rlinf_like.workers.rollout.agentic.openai_server import OpenAIServer
from small_runs import in_process, small_reasoning_config
from test_openai_endpoint import TEMPLATE, LockedEngine


@pytest.mark.parametrize("text, score", [("Yes, it matches.", 1.0), ("no.", 0.0), (" NO", 0.0), ("maybe yes", None),
                                         ("", None)])
def test_yes_no_verdicts(text, score):
    assert parse_yes_no(text) == score


@pytest.mark.parametrize("text, marker, score", [("Score: 7", "Score:", 0.7), ("I'd say... Score: 15 / 10", "Score:", 1.0),
                                                 ("Score: 2 then Score: 4.5", "Score:", 0.45), ("7 out of 10", "Score:", None),
                                                 ("first 3, finally 8", "", 0.8), ("Score: none", "Score:", None)])
def test_number_verdicts(text, marker, score):
    assert parse_number(text, marker, 10.0) == score


def test_the_prompt_names_what_it_lacks():
    assert render("{prompt}|{response}|{answer}|{level}", "P", "R", "A", {"level": 3}) == "P|R|A|3"
    with pytest.raises(ValueError, match=r"judge.template names \{hint\}, which is neither prompt, response, answer "
                                         r"nor a column of the data row \(it has \['level'\]\)"):
        render("{hint}", "P", "R", "A", {"level": 3})


def test_the_reward_weighs_judge_and_rule_and_counts_unparsed():
    cfg, judge = RewardConfig(error_value=-1.0), JudgeConfig(weight=1.0, rule_weight=0.5)
    right = judge_reward("so \\boxed{5}", "5", config=cfg, judge=judge, judge_score=0.0)
    assert right["reward"] == 0.5 and right["correct"] and right["judge_agrees"] == 0.0
    unparsed = judge_reward("\\boxed{4}", "5", config=cfg, judge=judge, judge_score=None)
    assert unparsed["reward"] == -1.0 + 0.5 * cfg.format and unparsed["judge_parse_failed"] == 1.0
    assert "judge_agrees" not in unparsed


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("judge"), TinyModelSpec(max_position_embeddings=1024)))
    return path, load_tokenizer(path)


def results(tokenizer, n_requests=2, n=3):
    ids = tokenizer("7+5=12", add_special_tokens=False).input_ids
    return [RolloutResult(f"r{i}", tokenizer("What is 7+5?").input_ids, [ids] * n, [[0.0] * len(ids)] * n,
                          ["stop"] * n) for i in range(n_requests)]


def test_our_judge_scores_a_step_in_one_engine_call(tiny):
    path, tokenizer = tiny
    judge = JudgeWorker(path, JudgeConfig(model_path=path, parser="number", max_tokens=6), max_context=1024)
    scores = judge.judge(results(tokenizer), ["12", "12"], [{}, {}])
    assert [len(s) for s in scores] == [3, 3] and judge.engine_calls() == 1  # 6 verdicts, one generate
    assert all(s is None or 0.0 <= s <= 1.0 for row in scores for s in row)
    judge.judge(results(tokenizer, 1, 2), ["12"], [{}])
    assert judge.engine_calls() == 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def judge_url(tiny):
    """Our own OpenAI-compatible endpoint over the tiny model, standing in for any remote judge."""
    path, tokenizer = tiny
    engine = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=8), tokenizer=tokenizer)
    server = OpenAIServer(LockedEngine(engine).submit, tokenizer, TEMPLATE, "judge-model", 1024)
    server.start()
    yield f"http://127.0.0.1:{server.port}/v1"
    server.close()


def test_a_remote_judge_through_our_endpoint_and_a_dead_one(tiny, judge_url, caplog):
    path, tokenizer = tiny
    cfg = JudgeConfig(base_url=judge_url, model="judge-model", max_tokens=4)
    scores = JudgeWorker(path, cfg).judge(results(tokenizer, 1, 2), ["12"], [{}])
    assert len(scores[0]) == 2  # gibberish from an untrained judge: None, scored error_value downstream
    dead = JudgeConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="judge-model", timeout_s=5)
    with caplog.at_level(logging.WARNING):
        assert JudgeWorker(path, dead).judge(results(tokenizer, 1, 2), ["12"], [{}]) == [[None, None]]
    assert "request r0/1: APIConnectionError" in caplog.text and dead.base_url in caplog.text


def judge_config(out, **judge):
    cfg = small_reasoning_config(out, samples_per_prompt=2)
    cfg.reward.fn = "judge"
    cfg.judge = JudgeConfig(parser="number", max_tokens=6, **judge)
    return in_process(cfg, {"actor,rollout": "0", "reward,judge": "1"})


def test_the_judge_section_is_checked_before_any_worker(tmp_path, tiny):
    with pytest.raises(ValueError, match=r"reward.fn=judge needs one judge: judge.model_path .* or judge.base_url"):
        check_config(judge_config(tmp_path))
    cfg = small_reasoning_config(tmp_path)
    cfg.judge.model_path = tiny[0]
    with pytest.raises(ValueError, match=r"judge.model_path=.* is read by reward.fn=judge only"):
        check_config(cfg)


@pytest.mark.timeout(300)
def test_two_steps_with_our_judge_and_with_a_remote_one(tmp_path, tiny, judge_url):
    runs = {"ours": judge_config(tmp_path / "ours", model_path=tiny[0]),
            "remote": judge_config(tmp_path / "remote", base_url=judge_url, model="judge-model")}
    for name, cfg in runs.items():
        steps = [h for h in train(cfg).history if "loss" in h]
        assert len(steps) == 2, name
        for h in steps:  # an untrained judge: its verdicts rarely parse, and every sample is counted
            assert 0.0 <= h["reward/judge_parse_failed"] <= 1.0 and "reward/rule_reward" in h, name
