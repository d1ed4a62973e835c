"""textarena/<ID> against TextArena itself: the same games for the same seeds, its end rewards and outcomes."""

from __future__ import annotations

import random

import pytest

import agentenv
from agentenv.checker import check_env
from agentenv.errors import ConfigError, EnvNotFound, ResetNeeded

ta = pytest.importorskip("textarena", reason="textarena is not installed (pip install 'agentenv[textarena]'; "
                                              "scripts/install.sh --all)")
from agentenv.adapters.textarena_env import TextArenaEnv, is_single_player, listed_ids  # noqa: E402

GAME = "GuessTheNumber-v0"  # 1..20, 10 turns


def direct(seed: int, actions: list[str]) -> tuple[int, list[tuple[bool, dict]], tuple]:
    """TextArena played directly: (secret, per-step (done, info), close())."""
    state = random.getstate()
    try:
        env = ta.make(GAME)
        env.reset(num_players=1, seed=seed)
        steps = [env.step(a) for a in actions]
        return env.game_number, steps, env.close()
    finally:
        random.setstate(state)


async def test_games_and_rewards_are_textarenas() -> None:
    env = agentenv.make(f"textarena/{GAME}", task_seed=40, num_tasks=4)
    assert type(env) is TextArenaEnv and env.tasks().ids == tuple(f"{GAME}/{s}" for s in range(40, 44))
    random.seed(99)
    expected_global = random.random()
    random.seed(99)
    obs, info = await env.reset(options={"task": 3})
    secret = env.ta_env.game_number
    wrong = 20 if secret != 20 else 19
    d_secret, d_steps, (d_rewards, d_info) = direct(43, [f"[{wrong}]", f"[{secret}]"])
    assert secret == d_secret and info == {"task_id": f"{GAME}/43"}
    assert obs.startswith("[GAME] You are Player 0. You are playing Guess The Number.")
    r = await env.step(f"[{wrong}]")
    assert (r.reward, r.terminated, r.truncated) == (0.0, False, False) == (0.0, d_steps[0][0], False)
    assert r.observation == f"[Player] [{wrong}]\n[GAME] The target number is lower."
    r = await env.step(str(secret))  # ActionFormattingWrapper adds the brackets
    assert (r.reward, r.terminated, r.truncated) == (float(d_rewards[0]), True, False) == (1.0, True, False)
    assert r.info["game_info"] == d_info[0] and "Congratulations" in r.info["game_info"]["reason"]
    with pytest.raises(ResetNeeded):
        await env.step("[1]")
    assert random.random() == expected_global


async def test_turn_limit_and_invalid_moves_score_as_textarena_does() -> None:
    env = agentenv.make(f"textarena/{GAME}", max_turns=2)
    await env.reset(options={"task": 5})
    secret = env.ta_env.game_number
    guesses = [f"[{g}]" for g in (1, 2, 3, 4) if g != secret][:3]
    played = [await env.step(g) for g in guesses]
    state = random.getstate()
    d = ta.make(GAME, max_turns=2)
    d.reset(num_players=1, seed=5)
    d_done = [d.step(g)[0] for g in guesses]
    d_rewards, _ = d.close()
    random.setstate(state)
    assert [r.terminated for r in played] == d_done == [False, False, True]  # TextArena's own turn count
    assert not any(r.truncated for r in played)
    assert played[-1].reward == float(d_rewards[0]) == pytest.approx(1 - abs(int(guesses[-1][1:-1]) - secret) / 19)
    await env.reset(seed=1)
    r1 = await env.step("no number")  # first invalid move: a warning, the game goes on
    r2 = await env.step("still none")
    assert (r1.terminated, r2.terminated, r2.reward) == (False, True, 0.0)
    assert r2.info["game_info"]["invalid_move"] is True and "invalid move" in r1.observation


async def test_seeded_check_env_and_raw_ids() -> None:
    report = await check_env(agentenv.make(f"textarena/{GAME}"), actions=["[7]", "[13]"])
    assert report.checks[3] == "tasks_by_index" and report.checks[-1] == "close_twice"
    raw = agentenv.make(f"textarena/{GAME}-raw")
    obs, _ = await raw.reset(options={"task": 0})
    assert obs.startswith("[GAME] You are Player 0.")
    r = await raw.step("[1]" if raw.ta_env.game_number != 1 else "[2]")
    assert r.observation.startswith("[Player] [") and "[GAME] The target number is higher." in r.observation


def test_only_single_player_games() -> None:
    assert is_single_player(GAME) and not is_single_player("TicTacToe-v0")
    ids = listed_ids()
    assert GAME in ids and "TicTacToe-v0" not in ids and "Wordle-v0" in ids
    with pytest.raises(EnvNotFound):
        agentenv.make("textarena/TicTacToe-v0")
    with pytest.raises(ConfigError, match="not a single-player game"):
        TextArenaEnv("TicTacToe-v0")
