"""TextArena games through `agent.env=textarena` (`envs/text/textarena_env.py`): the adapter alone plays
GuessTheNumber-v0 to the end by binary search, each turn showing only what the game's log gained; then episodes of
the tiny model over the native engine keep exactly the engine's tokens."""

import importlib.util
import re

import pytest

if importlib.util.find_spec("textarena") is None:  # a lookup: importing it here would cost every pytest worker
    pytest.skip("the [textarena] extra (scripts/setup.sh installs it)", allow_module_level=True)

from rlinf_like.envs.text.config import AgentConfig, TextArenaOptions  # noqa: E402
from rlinf_like.envs.text.textarena_env import TextArenaText  # noqa: E402
from rlinf_like.models.tiny import char_tokenizer  # noqa: E402
from rlinf_like.workers.rollout import RolloutRequest, SamplingParams  # noqa: E402
from rlinf_like.workers.rollout.agentic.agent_loop import AgentLimits, AgentLoop  # noqa: E402
from test_agent_loop import TEMPLATE, RecordingClient, engine, model_path  # noqa: E402, F401  (fixtures)

GAME = "GuessTheNumber-v0"


def test_binary_search_wins_and_each_turn_shows_only_the_games_answer():
    env = TextArenaText(GAME)
    [opening] = env.reset({"seed": 3})
    assert "You are playing Guess The Number" in opening["content"] and "between 1 and 20" in opening["content"]
    low, high, turns = 1, 20, 0
    while True:
        guess = (low + high) // 2
        step = env.step(f"[{guess}]")
        turns += 1
        if step.done:
            break
        [news] = step.messages
        assert news["content"].startswith(f"[Player] [{guess}]") and "You are playing" not in news["content"]
        if "higher" in news["content"]:
            low = guess + 1
        else:
            assert "lower" in news["content"]
            high = guess - 1
    assert step.reward == 1.0 and step.end_reason == "answer" and turns <= 5


def test_an_unknown_game_is_refused_by_key():
    with pytest.raises(ValueError, match="agent.env=textarena needs agent.textarena.env_id"):
        TextArenaText.check(AgentConfig(env="textarena"))
    with pytest.raises(ValueError, match=r"agent.textarena.env_id='NoSuchGame-v0': TextArena cannot make it"):
        TextArenaText.check(AgentConfig(env="textarena", textarena=TextArenaOptions(env_id="NoSuchGame-v0")))


def test_episodes_against_a_textarena_game_keep_the_engines_tokens(engine):  # noqa: F811 (the imported fixture)
    limits = AgentLimits(max_turns=3, max_total_tokens=900, max_new_tokens_per_turn=16)
    requests = [RolloutRequest(f"t{i}", [], SamplingParams(temperature=1.0, seed=11 + i), n=2) for i in range(2)]
    tok = char_tokenizer()
    with RecordingClient(engine) as client:
        results = AgentLoop(client, tok, TEMPLATE, lambda: TextArenaText(GAME), limits).run(
            requests, [{"seed": i} for i in range(2)])
    for result in results:
        assert not result.excluded and "You are playing Guess The Number" in tok.decode(result.prompt_ids)
        for j, response in enumerate(result.response_ids):
            info, mask = result.episodes[j], result.response_masks[j]
            model = [t for t, m in zip(response, mask) if m == 1]
            assert model == [t for turn in range(info.turns)
                             for t in client.turns[f"{result.request_id}/{j}/{turn}"][1].response_ids[0]]
            games = tok.decode([t for t, m in zip(response, mask) if m == 0])
            assert info.turns == 1 or re.search(r"\[GAME\]|\[Player\]", games)
