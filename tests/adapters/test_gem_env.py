"""gem/<ID> against GEM (gem-llm) itself: same games for the same seeds, GEM's rewards and flags."""

from __future__ import annotations

import random

import pytest

import agentenv
from agentenv.checker import check_env
from agentenv.errors import ConfigError, EnvNotFound, ResetNeeded

pytest.importorskip("gem", reason="gem-llm is not installed (pip install 'agentenv[gem]'; scripts/install.sh --all)")
from gem.utils.constants import LanguageGameReward  # noqa: E402

from agentenv.adapters.gem_env import GemEnv, gem_registry, listed_ids  # noqa: E402

GAME = "game:GuessTheNumber-v0"  # 1..20, 10 turns


def direct_secret(task_seed: int) -> int:
    """The number GEM itself deals for ``task_seed`` (its games draw from the global random, seeded here)."""
    import gem

    state = random.getstate()
    try:
        env = gem.make(GAME)
        random.seed(task_seed)
        env.reset(seed=task_seed)
        return env.game_number
    finally:
        random.setstate(state)


async def test_games_rewards_and_flags_are_gems() -> None:
    env = agentenv.make(f"gem/{GAME}", task_seed=100, num_tasks=5)
    assert type(env) is GemEnv and env.tasks().ids == tuple(f"{GAME}/{s}" for s in range(100, 105))
    random.seed(1234)
    expected_global = random.random()
    random.seed(1234)
    obs, info = await env.reset(options={"task": 2})
    secret = env.gem_env.game_number
    assert secret == direct_secret(102) and info["task_id"] == f"{GAME}/102" and "Guess The Number" in obs
    wrong = 1 if secret != 1 else 2
    r = await env.step(f"\\boxed{{{wrong}}}")
    assert (r.reward, r.terminated, r.truncated) == (LanguageGameReward.internal_step_reward, False, False)
    assert r.info["suffix"] == "Enter your next guess." and r.info["task_id"] == f"{GAME}/102"
    r = await env.step(f"I guess \\boxed{{{secret}}}")
    assert (r.reward, r.terminated, r.truncated) == (LanguageGameReward.success_reward, True, False)
    with pytest.raises(ResetNeeded):
        await env.step("\\boxed{3}")
    await env.reset(options={"task": 0})
    r = await env.step("no guess")
    assert (r.reward, r.terminated, r.truncated) == (LanguageGameReward.format_error_reward, True, False)
    assert random.random() == expected_global  # GEM's draws came from the env's private stream


async def test_turn_limit_is_gems_terminated_and_truncated() -> None:
    env = agentenv.make(f"gem/{GAME}", max_turns=2)
    await env.reset(seed=5)
    secret = env.gem_env.game_number
    guesses = [g for g in range(1, 21) if g != secret][:2]
    r1 = await env.step(f"\\boxed{{{guesses[0]}}}")
    r2 = await env.step(f"\\boxed{{{guesses[1]}}}")
    assert (r1.terminated, r1.truncated, r2.terminated, r2.truncated) == (False, False, True, True)
    assert r2.reward == pytest.approx(1 - abs(guesses[1] - secret) / 19)  # GEM's closeness reward


async def test_seeded_and_check_env() -> None:
    env = agentenv.make(f"gem/{GAME}")
    a = await env.reset(seed=9)
    n = env.gem_env.game_number
    assert a == await env.reset(seed=9) and env.gem_env.game_number == n
    report = await check_env(agentenv.make(f"gem/{GAME}"), actions=["\\boxed{7}", "\\boxed{13}"])
    assert report.checks[3] == "tasks_by_index" and report.checks[-1] == "close_twice"
    mastermind = agentenv.make("gem/game:Mastermind-v0-easy")
    obs, _ = await mastermind.reset(seed=1)
    assert "Mastermind" in obs


def test_ids_listed_and_refused() -> None:
    assert "game:GuessTheNumber-v0" in listed_ids() and all(i.startswith("game:") for i in listed_ids())
    assert set(listed_ids()) <= set(gem_registry())
    with pytest.raises(EnvNotFound):
        agentenv.make("gem/game:NoSuchGame-v0")
    with pytest.raises(ConfigError, match="num_tasks must be >= 1"):
        agentenv.make(f"gem/{GAME}", num_tasks=0)
