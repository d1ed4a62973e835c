"""gym/<ID>: a real Gymnasium env with Text spaces, built by gymnasium.make (TimeLimit included)."""

from __future__ import annotations

import gymnasium
import pytest
from gymnasium import spaces

import agentenv
from agentenv.adapters.gym_env import GymnasiumEnv
from agentenv.checker import check_env
from agentenv.core import text_space
from agentenv.errors import ConfigError, EnvNotFound, ResetNeeded
from agentenv.gym_adapter import register_gymnasium_envs
from tests.tiny_env import RepeatNumberEnv

GYM_ID = "agentenv_tests/SpellBack-v0"


class SpellBackEnv(gymnasium.Env):
    """Gymnasium env: shows a word from its own generator; reward 1.0 and terminated for the word reversed."""

    metadata = {"render_modes": []}
    WORDS = ("gym", "text", "space", "agent")

    def __init__(self, penalty: float = -0.5) -> None:
        self.observation_space = text_space(64)  # a spaces.Text whose charset has blanks
        self.action_space = spaces.Text(64)
        self.penalty = penalty
        self.word = ""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        index = (options or {}).get("task", int(self.np_random.integers(len(self.WORDS))))
        self.word = self.WORDS[index]
        return f"spell {self.word} backwards", {"task_id": f"word/{index}"}

    def step(self, action):
        if action == self.word[::-1]:
            return "right", 1.0, True, False, {"word": self.word}
        return "wrong", self.penalty, False, False, {"word": self.word}


@pytest.fixture(scope="module", autouse=True)
def gym_registered():
    gymnasium.register(GYM_ID, entry_point=SpellBackEnv, max_episode_steps=3)
    yield
    gymnasium.registry.pop(GYM_ID, None)


async def test_rewards_flags_and_info_are_gymnasiums() -> None:
    env = agentenv.make(f"gym/{GYM_ID}", penalty=-0.25)
    assert type(env) is GymnasiumEnv and agentenv.spec(f"gym/{GYM_ID}").kwargs == {"gym_id": GYM_ID}
    obs, info = await env.reset(seed=0, options={"task": 1})
    assert (obs, info) == ("spell text backwards", {"task_id": "word/1"})
    assert tuple(await env.step("text")) == ("wrong", -0.25, False, False, {"word": "text"})
    r = await env.step("txet")
    assert (r.reward, r.terminated, r.truncated) == (1.0, True, False)
    with pytest.raises(ResetNeeded):
        await env.step("txet")
    await env.close()


async def test_time_limit_truncates_not_terminates() -> None:
    env = agentenv.make(f"gym/{GYM_ID}", in_thread=False)
    await env.reset(seed=3)
    flags = [((r := await env.step("no")).terminated, r.truncated) for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]  # gymnasium's TimeLimit(3)
    env2 = agentenv.make(f"gym/{GYM_ID}", max_episode_steps=1)
    await env2.reset(seed=3)
    assert (await env2.step("no")).truncated is True


async def test_seeded_reset_matches_the_gymnasium_env_and_check_env_passes() -> None:
    env = agentenv.make(f"gym/{GYM_ID}")
    direct = gymnasium.make(GYM_ID)
    for seed in (0, 1, 2, 7):
        assert (await env.reset(seed=seed))[0] == direct.reset(seed=seed)[0]
    report = await check_env(agentenv.make(f"gym/{GYM_ID}"), actions=["x", "y"])
    assert report.checks[-1] == "close_twice" and "step_after_end_raises" in report.checks


async def test_round_trip_through_agentenvs_own_gymnasium_face() -> None:
    agentenv.register("tests/RepeatNumber-v0", RepeatNumberEnv, description="test env")
    try:
        register_gymnasium_envs()
        env = agentenv.make("gym/agentenv/tests.RepeatNumber-v0", high=10)
        obs, info = await env.reset(seed=4)
        assert obs == f"Say {info['n']}"
        assert tuple(await env.step(str(info["n"]))) == ("correct", 1.0, True, False, {"tries": 1})
        await env.close()
    finally:
        gymnasium.registry.pop("agentenv/tests.RepeatNumber-v0", None)


def test_non_text_spaces_and_unknown_ids_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"observation_space is Box.*not spaces.Text"):
        agentenv.make("gym/CartPole-v1")
    with pytest.raises(EnvNotFound, match="gym/ID"):
        agentenv.make("gym/NoSuchGame-v0")
    with pytest.raises(ConfigError, match="rejected the keyword arguments"):
        agentenv.make(f"gym/{GYM_ID}", no_such_option=1)
    assert "gym/NoSuchGame-v0" not in agentenv.registry
