"""Each adapter states what a reply cut by the token budget does: games play it as the move, one graded answer
ends there."""

from __future__ import annotations

import gymnasium
import pytest

import agentenv
from agentenv.rollout.episode import RolloutConfig, run_episode
from tests.adapters.test_gym_env import GYM_ID, SpellBackEnv
from tests.fakes import CharRenderer, ScriptedEngine


@pytest.fixture
def spell_back():
    gymnasium.register(GYM_ID, entry_point=SpellBackEnv, max_episode_steps=3)
    yield f"gym/{GYM_ID}"
    gymnasium.registry.pop(GYM_ID, None)


@pytest.mark.parametrize("env_id, package, expected", [
    ("reasoning_gym/gcd", "reasoning_gym", "end"),
    ("reasoning_gym_tool/gcd", "reasoning_gym", "end"),
    ("gem/game:GuessTheNumber-v0", "gem", "act"),
    ("textarena/GuessTheNumber-v0", "textarena", "act"),
])
async def test_each_family_states_its_cut_turn(env_id, package, expected):
    pytest.importorskip(package)
    async with agentenv.make(env_id) as env:
        assert env.cut_turn == expected


@pytest.mark.parametrize("gem_id, expected", [("math:Orz57K", "end"), ("qa:HotpotQA", "end"),
                                             ("code:Taco8k", "end"), ("game:GuessTheNumber-v0", "act")])
def test_gem_single_answer_tasks_end_at_a_cut_reply(gem_id, expected, monkeypatch):
    """GEM's non-game ids (math, qa, code: one graded answer) end; its games play the cut move.

    Their datasets come from the Hugging Face hub, which tests never reach, so ``gem.make`` is replaced
    by a stand-in; the id is checked against GEM's real registry.
    """
    gem = pytest.importorskip("gem")
    from agentenv.adapters.gem_env import GemEnv, gem_registry

    if gem_id not in gem_registry():
        pytest.skip(f"this gem-llm release does not register {gem_id}")
    monkeypatch.setattr(gem, "make", lambda *_a, **_k: object())
    env = GemEnv(gem_id)
    assert env.cut_turn == expected
    assert GemEnv.cut_turn == "act"  # the class default is untouched: the rule is per instance


async def test_a_game_plays_a_cut_reply_as_its_move(spell_back):
    """Every reply is cut at 3 tokens ("abc" of "abcdefgh"): the game goes on to its 3-step limit."""
    async with agentenv.make(spell_back) as env:
        assert env.cut_turn == "act"
        cfg = RolloutConfig(max_turns=10, max_new_tokens_per_turn=3, max_total_tokens=500)
        traj = await run_episode(env, ScriptedEngine(["abcdefgh"]), CharRenderer(), cfg, seed=0)
    assert traj.info["turns"] == 3 and traj.info.get("truncation") == "env" and traj.status != "error"
