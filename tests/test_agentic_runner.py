"""Multi-turn runs in the reasoning runner (the `agent` section): refusals before launch, the SFT warm-start's
demonstrations laid out exactly as the rollout lays out an episode, the loss masks, what the reward sees, the
episode metrics, and an agent program's samples. The presets' end-to-end runs are the docs-command runs of
examples/agentic/main_agent.py (tests/test_docs_commands.py) and the resume run here."""

import re
from pathlib import Path

import pytest
import torch

from rlinf_like.data.batch import build_rl_batch, build_sft_batch
from rlinf_like.data.config import DataConfig
from rlinf_like.data.tasks import Problem
from rlinf_like.envs.text.config import AgentConfig
from rlinf_like.models.tiny import char_tokenizer
from rlinf_like.runners.reasoning.agent_format import AgentFormat, episode_metrics
from rlinf_like.runners.reasoning.checks import check_config
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.workers.reward.worker import final_turn
from rlinf_like.workers.rollout.agentic.agent_rollout import program_result
from rlinf_like.workers.rollout.agentic.chat_tokens import ChatTokens
from rlinf_like.workers.rollout.agentic.openai_sessions import SessionTrajectory
from rlinf_like.workers.rollout.types import EpisodeInfo, RolloutRequest, RolloutResult
from small_runs import in_process, small_reasoning_config

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = str(ROOT / "examples/agentic/chat_template.jinja")
CALL = '<tool_call>{"name":"calculator","arguments":{"expression":"722*93"}}</tool_call>'


def agent_config(**agent) -> ReasoningConfig:
    cfg = ReasoningConfig()
    cfg.data.chat_template = TEMPLATE
    cfg.agent = AgentConfig(**{"env": "tools", "tools": ["calculator"], **agent})
    return cfg


@pytest.mark.parametrize("change, message", [
    (lambda c: setattr(c.agent, "env", "shell"), "agent.env='shell' is not one of"),
    (lambda c: setattr(c.agent, "tools", ["calculator", "abacus"]), "agent.tools='abacus' is not one of"),
    (lambda c: setattr(c.agent, "tools", []), "agent.env=tools needs agent.tools"),
    (lambda c: setattr(c.data, "chat_template", "none"), "data.chat_template must be auto"),
    (lambda c: setattr(c.runner, "schedule", "dynamic"), "runner.schedule in ['static', 'async', 'collocated', "
                                                          "'pipelined']; got 'dynamic'"),
    (lambda c: (setattr(c.agent, "env", ""), setattr(c.agent, "tools", []), setattr(c.runner, "schedule", "async"),
                setattr(c.agent, "program", "examples.agentic.openai_agent:solve")),
     "runner.schedule=async runs agent.env episodes; agent.program is not built for it (its endpoint serves one "
     "generate call at a time): use static or collocated or pipelined"),
    (lambda c: setattr(c.rollout, "tp_size", 2), "rollout.tp_size=1"),
    (lambda c: setattr(c.rollout, "engine", "hf"), "rollout.engine in"),
    (lambda c: setattr(c.agent, "program", "examples.agentic.openai_agent:solve"), "set one"),
    (lambda c: (setattr(c.agent, "env", ""), setattr(c.agent, "tools", []),
                setattr(c.agent, "program", "no_such_module:solve")), "agent.program"),
    (lambda c: (setattr(c.agent, "env", ""), ), "agent.tools=['calculator'] is read by agent.env=tools only"),
])
def test_a_bad_agent_section_is_refused_before_launch_by_key(change, message):
    cfg = agent_config()
    check_config(cfg)  # the preset's own section passes
    change(cfg)
    with pytest.raises(ValueError, match=re.escape(message)):
        check_config(cfg)


def test_a_demonstration_is_laid_out_as_the_rollout_lays_out_the_episode():
    """The warm-start's target is the model's turns (text + end-of-turn, mask 1) and the calculator's real answer
    rendered through the template (mask 0): token for token what a rollout appends when the model writes them."""
    cfg = agent_config()
    tok = char_tokenizer()
    fmt = AgentFormat(tok, cfg)
    p = Problem(prompt="What is 722*93?", answer="67146", fields={"demo": [CALL, "\\boxed{67146}"]})
    prompt, target, mask = fmt.sft_ids(p)
    assert tok.decode(prompt) == "S:tools: calculator(expression)<eos>U:What is 722*93?<eos>A:"
    chat = ChatTokens(tok, open(TEMPLATE).read(), fmt.env().tools)
    call = tok(CALL, add_special_tokens=False).input_ids + [tok.eos_token_id]
    tool = chat.env_ids([{"role": "tool", "name": "calculator", "content": "67146"}])
    answer = tok("\\boxed{67146}", add_special_tokens=False).input_ids + [tok.eos_token_id]
    assert tok.decode(tool) == "T:67146<eos>A:"
    assert target == call + tool + answer
    assert mask == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
    assert prompt == fmt.prompt_ids(p)  # what the rollout's episodes start from
    batch = build_sft_batch([prompt], [target], target_masks=[mask])
    assert batch["loss_mask"][0].tolist() == [0] * len(prompt) + mask

    with pytest.raises(ValueError, match="agent.demo_key='demo'"):
        fmt.sft_ids(Problem(prompt="What is 1*2?", answer="2"))
    with pytest.raises(ValueError, match="after the environment ended the episode"):  # an answer, then more
        fmt.sft_ids(Problem(prompt="What is 1*2?", answer="2", fields={"demo": ["\\boxed{2}", CALL]}))


def multi_turn_result() -> RolloutResult:
    """Two samples: one called the tool then answered; the other answered at once."""
    return RolloutResult("r", [1, 2, 3], response_ids=[[10, 11, 2, 20, 21, 12, 13, 2], [14, 2]],
                         logprobs=[[-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5, -0.6], [-0.7, -0.8]],
                         finish_reasons=["stop", "stop"], response_masks=[[1, 1, 1, 0, 0, 1, 1, 1], [1, 1]],
                         episodes=[EpisodeInfo(turns=2, end_reason="answer", tool_calls=1, env_reward=0.5),
                                   EpisodeInfo(turns=1, end_reason="answer")])


def test_the_loss_covers_the_models_tokens_and_the_reward_reads_its_last_turn():
    result = multi_turn_result()
    batch = build_rl_batch([result.prompt_ids] * 2, result.response_ids, result.logprobs, [0.0, 0.0],
                           masks=result.response_masks)
    # position t predicts token t + 1: the response starts at position 2 (the prompt's last token)
    assert batch["response_mask"][0].tolist() == [0, 0, 1, 1, 1, 0, 0, 1, 1, 1]
    assert batch["response_mask"][1].tolist() == [0, 0, 1, 1, 0, 0, 0, 0, 0, 0]
    assert torch.equal(batch["old_logprobs"][0][2:], torch.tensor(result.logprobs[0]))
    assert final_turn(result.response_ids[0], result.response_masks[0]) == [12, 13, 2]
    assert final_turn(result.response_ids[1], result.response_masks[1]) == [14, 2]
    with pytest.raises(ValueError, match="a mask of 2"):
        build_rl_batch([[1]], [[5, 6, 7]], [[0.0] * 3], [0.0], masks=[[1, 1]])


def test_episode_metrics():
    metrics = episode_metrics([multi_turn_result(), RolloutResult("s", [1], [[5]], [[0.0]], ["length"], episodes=[
        EpisodeInfo(turns=3, end_reason="max_turns", tool_calls=2, malformed_calls=2, env_wait_s=1.5, retries=1)],
        excluded="env.step: TimeoutError()")])
    assert metrics == {"agent/turns": 2.0, "agent/tool_calls": 1.0, "agent/tool_call_rate": 2 / 3,
                       "agent/malformed_rate": 2 / 5, "agent/env_wait_s": 0.5, "agent/end/answer": 2 / 3,
                       "agent/end/max_turns": 1 / 3, "agent/env_s": 1.5, "agent/env_retries": 1,
                       "agent/excluded_groups": 1}
    assert episode_metrics([RolloutResult("t", [1], [[2]], [[0.0]], ["stop"])]) == {}  # single turn: none


class Run:
    """What `run_programs` returns per sample (the fields `program_result` reads)."""

    def __init__(self, trajectories, reward=1.0, error=None, formatted=None):
        self.trajectories, self.reward, self.error = trajectories, reward, error
        self.retries, self.env_failed, self.scores, self.seconds = 0, False, {}, 0.0
        self.formatted = reward >= 1.0 if formatted is None else formatted  # as run_programs sets it


def test_a_programs_samples_share_their_common_prompt_and_keep_their_own_tokens():
    def traj(prompt, response, mask):
        return SessionTrajectory(prompt_ids=prompt, response_ids=response, response_mask=mask,
                                 logprobs=[-1.0 if m else 0.0 for m in mask], finish_reason="stop", version=3,
                                 num_calls=2)
    request = RolloutRequest("q", [1, 2], n=3, row={"prompt": "x"})
    runs = [Run([traj([1, 2, 7], [8, 9], [1, 1])]), Run([traj([1, 2, 6, 5], [4], [1])], reward=0.0),
            Run([], reward=0.0, error="ValueError: boom")]
    wrong = program_result(request, [Run([traj([1, 2], [3], [1])], reward=0.0, formatted=True)] * 3, version=3)
    assert [e.end_reason for e in wrong.episodes] == ["answer"] * 3 and wrong.episodes[0].program_formatted
    result = program_result(request, runs, version=3)
    assert result.prompt_ids == [1, 2]  # the common prefix; each sample's rest is response with mask 0
    assert result.response_ids == [[7, 8, 9], [6, 5, 4], []]
    assert result.response_masks == [[0, 1, 1], [0, 0, 1], []]
    assert result.logprobs == [[0.0, -1.0, -1.0], [0.0, 0.0, -1.0], []]
    assert [e.program_reward for e in result.episodes] == [1.0, 0.0, 0.0]
    # an answer only where the program's reward function parsed one: not a reward-0 episode (gibberish) that did not
    assert [e.end_reason for e in result.episodes] == ["answer", "no_answer", "error"]
    assert [e.program_formatted for e in result.episodes] == [True, False, False]
    assert result.finish_reasons == ["stop", "stop", "error"]


def calculator_config(tmp: str, steps: int):
    """The calculator preset, small: 8 of its held-out rows (evaluations stay short), a checkpoint every step."""
    held_out = Path(tmp) / "held_out.jsonl"
    if not held_out.exists():
        lines = (ROOT / "examples/agentic/data/calculator_test.jsonl").read_text().splitlines(keepends=True)
        held_out.write_text("".join(lines[:8]))
    cfg = in_process(small_reasoning_config(Path(tmp), max_steps=steps, save_every=1, samples_per_prompt=2))
    cfg.data = DataConfig(source="files", chat_template=TEMPLATE)
    cfg.data.train_files = [str(ROOT / "examples/agentic/data/calculator_train.jsonl")]
    cfg.data.test_files = [str(held_out)]
    cfg.model.max_positions = 320
    cfg.agent = AgentConfig(env="tools", tools=["calculator"], max_turns=3, max_total_tokens=192)
    cfg.runner.sft_steps, cfg.runner.sft_batch_size, cfg.runner.max_new_tokens = 2, 4, 96
    cfg.runner.eval_every, cfg.runner.resume = 2, steps > 2
    return cfg


def calculator_runs(tmp: str) -> tuple[list, list]:
    """A 2-step calculator run saving every step, then the same run resumed to step 3."""
    from rlinf_like.runners.reasoning import train

    return train(calculator_config(tmp, 2)).history, train(calculator_config(tmp, 3)).history


def served_calculator_run(tmp: str) -> list:
    """The asynchronous schedule: episodes served continuously, weights arriving mid-episode."""
    from rlinf_like.runners.reasoning import train

    serving = calculator_config(tmp, 2)
    serving.runner.output_dir = str(Path(tmp) / "async")
    serving.runner.schedule, serving.runner.max_staleness = "async", 1
    serving.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "1"}
    return train(serving).history


@pytest.mark.slow
def test_a_calculator_run_trains_on_episodes_and_resumes(tmp_path):
    # in process (cluster.backend=local), one run after another: the episodes and the schedules are the subject
    (tmp_path / "served").mkdir()
    first, resumed = calculator_runs(str(tmp_path))
    served = served_calculator_run(str(tmp_path / "served"))
    assert [h["step"] for h in first] == [0, 1, 2] and [h["step"] for h in resumed] == [0, 1, 2, 3]
    assert resumed[:3] == first  # the history up to the checkpoint is kept as it was
    for h in first[1:] + resumed[3:]:
        assert h["agent/turns"] >= 1 and 0 <= h["agent/tool_call_rate"] <= 1 and "agent/malformed_rate" in h
        assert abs(sum(v for k, v in h.items() if k.startswith("agent/end/")) - 1) < 1e-9
    assert "eval_agent/turns" in first[2] and "eval_accuracy" in resumed[3]
    assert [h["step"] for h in served] == [0, 1, 2]
    assert all(h["staleness_max"] <= 1 and h["agent/turns"] >= 1 for h in served[1:])


def test_an_excluded_group_trains_on_nothing_and_too_many_stop_the_run():
    from rlinf_like.runners.reasoning.phases import check_excluded, scored
    from rlinf_like.workers.reward.types import SampleScore
    from rlinf_like.workers.rollout import RolloutResult

    def result(name, excluded=""):
        return RolloutResult(name, [1, 2], [[3, 4], [5]], [[-0.1, -0.2], [-0.3]], ["stop", "stop"],
                             excluded=excluded)

    results = [result("ok"), result("bad", "env.step: RuntimeError('down') (sample 1, after 1 retries)")]
    score = lambda reward: SampleScore(reward=reward, correct=reward > 0, formatted=True)  # noqa: E731
    groups = [[score(1.0), score(0.0)], [score(1.0), score(1.0)]]
    out = scored(results, groups, pad_id=0, seconds=0.0)
    assert out.rewards.tolist() == [1.0, 0.0, 0.0, 0.0]  # the excluded group's scores do not count
    assert out.batch["response_mask"].sum(-1).tolist() == [2, 1, 0, 0]
    cfg = agent_config()
    cfg.agent.max_excluded_share = 0.5
    check_excluded(cfg, results)  # one of two: at the bound, the run goes on
    cfg.agent.max_excluded_share = 0.25
    with pytest.raises(RuntimeError, match=re.escape(
            "agent.env='tools': 1 of 2 groups of this step were excluded, above agent.max_excluded_share=0.25, each "
            "after agent.env_retries=1 fresh environments; the last error: env.step: RuntimeError('down') (sample 1, "
            "after 1 retries)")):
        check_excluded(cfg, results)


def test_an_agent_program_s_episode_line_shows_its_reward_parts_not_tool_counts_it_cannot_see():
    """A verifiers episode runs its tools in the environment's own processes: the trainer counts none, so its line
    shows the rubric's reward and functions rather than "tool calls 0"."""
    from rlinf_like.runners.reasoning.agent_format import episode_summary

    program = EpisodeInfo(turns=2, end_reason="no_answer", program_reward=0.25,
                          scores={"correct": 0.0, "used_calculator": 1.0})
    assert episode_summary(program) == "turns 2, reward 0.25 (correct 0, used_calculator 1), ended: no_answer"
    tools = EpisodeInfo(turns=3, end_reason="answer", tool_calls=2, malformed_calls=1)
    assert episode_summary(tools) == "turns 3, tool calls 2, malformed 1, ended: answer"
