"""AlfWorldEnv on real ALFWorld games (TextWorld + alfworld wrappers)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="the alfworld package is not installed (scripts/install_alfworld.sh)")

from agentenv.core import StepResult  # noqa: E402
from agentenv.envs.alfworld import AlfWorldEnv, GameRef, list_games, read_game  # noqa: E402
from agentenv.errors import ConfigError, DataError, ResetNeeded  # noqa: E402
from agentenv.registration import make  # noqa: E402

pytestmark = pytest.mark.alfworld

# valid_seen index 0: look_at_obj_in_light-AlarmClock-None-DeskLamp-323, walkthrough of 3 commands.
GAME0 = "look_at_obj_in_light-AlarmClock-None-DeskLamp-323/trial_T20190909_044715_250790"


@pytest.fixture(scope="module")
def seen() -> list[GameRef]:
    return list_games("valid_seen")


async def test_registered_and_first_observation(seen: list[GameRef]) -> None:
    env = make("alfworld", split="valid_seen")
    assert isinstance(env, AlfWorldEnv)
    async with env:
        obs, info = await env.reset(options={"game": 0})
        assert info["game"] == GAME0 == seen[0].name
        assert info["task_type"] == "look_at_obj_in_light"
        assert info["steps"] == 0 and info["won"] is False
        assert "Your task is to: look at alarmclock under the desklamp." in obs
        assert "Welcome to TextWorld" not in obs
        assert "go to desk 1" in info["admissible_commands"]
        assert "Admissible commands: " in obs and "go to desk 1" in obs
        assert env.observation_space.contains(obs)


async def test_tasks_are_the_sorted_games_and_the_task_option_plays_one(seen: list[GameRef]) -> None:
    from agentenv.envs.alfworld.env import cached_games

    async with make("alfworld", split="seen") as env:
        tasks = env.tasks()
        assert len(tasks) == 140 and tasks.ids[0] == f"valid_seen/{GAME0}"
        assert tasks.kinds == tuple(g.task_type for g in seen) and "pick_two_obj" in tasks.kinds
        obs, info = await env.reset(options={"task": 5})
        assert info["task_id"] == tasks.ids[5] and info["game"] == seen[5].name and info["game_index"] == 5
        with pytest.raises(DataError, match="out of range"):
            await env.reset(options={"task": 140})
    assert cached_games("valid_seen") == seen and cached_games("seen") is not cached_games("seen")  # copies


async def test_walkthrough_with_messy_replies_wins(seen: list[GameRef]) -> None:
    walk = read_game(seen[0].path)["walkthrough"]
    assert walk == ["go to desk 1", "use desklamp 1", "take alarmclock 2 from desk 1"]
    replies = [
        "I should GO TO DESK 1!",
        "Thought: light.\nAction: Use DeskLamp 1.",
        "take alarmclock 2 from desk 1",
    ]
    async with AlfWorldEnv("valid_seen", games=seen) as env:
        await env.reset(options={"game": GAME0})
        results: list[StepResult] = [await env.step(r) for r in replies]
        assert [r.info["command"] for r in results] == walk
        assert [r.reward for r in results] == [0.0, 0.0, 1.0]
        assert [r.terminated for r in results] == [False, False, True]
        assert not any(r.truncated for r in results)
        assert results[-1].info["won"] is True and results[-1].info["steps"] == 3
        with pytest.raises(ResetNeeded):
            await env.step("look")
        # Resetting to the same game again (a second sample) starts it afresh.
        obs, info = await env.reset(options={"game": 0})
        assert info["steps"] == 0 and "look at alarmclock" in obs


@pytest.mark.parametrize(
    "reply", ["", "x" * 10_000, "ＧＯ ＴＯ ＤＥＳＫ ９ ✓ 日本語", "dance with the desklamp"]
)
async def test_bad_replies_get_the_games_feedback(reply: str, seen: list[GameRef]) -> None:
    async with AlfWorldEnv(games=seen[:1]) as env:
        await env.reset(options={"game": 0})
        obs, reward, terminated, truncated, info = await env.step(reply)
        assert obs.startswith("Nothing happens.")
        assert (reward, terminated, truncated, info["steps"]) == (0.0, False, False, 1)
        assert len(info["command"]) <= 200
        # The episode goes on normally after a bad reply.
        assert (await env.step("go to desk 1")).observation.startswith("You arrive at desk 1.")


async def test_step_limit_truncates(seen: list[GameRef]) -> None:
    async with AlfWorldEnv(games=seen[:1], max_steps=3, show_admissible=False) as env:
        with pytest.raises(ResetNeeded):
            await env.step("look")
        await env.reset(options={"game": 0})
        flags = [tuple(await env.step("look"))[2:4] for _ in range(3)]
        assert flags == [(False, False), (False, False), (False, True)]
        with pytest.raises(ResetNeeded):
            await env.step("look")
    with pytest.raises(ConfigError):
        AlfWorldEnv(max_steps=0)


async def test_seeded_reset_is_reproducible(seen: list[GameRef]) -> None:
    async def names(seed: int) -> list[str]:
        async with AlfWorldEnv(games=seen[:6]) as env:
            out = [(await env.reset(seed=seed))[1]["game"]]
            out += [(await env.reset())[1]["game"]]
            return out

    a, b = await names(7), await names(7)
    assert a == b
    assert {*(await names(8)), *a} <= {g.name for g in seen[:6]}


async def test_bad_game_files_are_data_errors_and_the_env_survives(
    tmp_path: Path, seen: list[GameRef]
) -> None:
    corrupt = tmp_path / "corrupt.tw-pddl"
    corrupt.write_text(seen[0].path.read_text()[:1000])
    broken_pddl = tmp_path / "broken.tw-pddl"
    data = read_game(seen[0].path)
    broken_pddl.write_text(
        json.dumps(data | {"pddl_problem": "(define (problem x) (:domain alfred) (:init (oops"})
    )
    games = [
        GameRef(tmp_path / "missing.tw-pddl", "a/missing", "pick_and_place"),
        GameRef(corrupt, "b/corrupt", "pick_and_place"),
        GameRef(broken_pddl, "c/broken", "pick_and_place"),
        seen[0],
    ]
    async with AlfWorldEnv(games=games) as env:
        with pytest.raises(DataError, match="not found"):
            await env.reset(options={"game": 0})
        with pytest.raises(DataError, match="not JSON"):
            await env.reset(options={"game": "b/corrupt"})
        with pytest.raises(DataError, match="TextWorld cannot"):
            await env.reset(options={"game": 2})
        with pytest.raises(ResetNeeded):
            await env.step("look")
        with pytest.raises(DataError, match="out of range"):
            await env.reset(options={"game": 9})
        with pytest.raises(DataError, match="no game"):
            await env.reset(options={"game": "nope"})
        obs, info = await env.reset(options={"game": 3})
        assert info["game"] == GAME0


def test_unknown_split_is_a_data_error() -> None:
    with pytest.raises(DataError, match="unknown ALFWorld split"):
        AlfWorldEnv("valid_train")


async def test_concurrent_games_do_not_block_the_loop(seen: list[GameRef]) -> None:
    """Four resets at once (about a second of CPU each) while a ticker measures the loop's latency."""
    gaps: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    envs = [AlfWorldEnv(games=seen) for _ in range(4)]
    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    infos = await asyncio.gather(*(e.reset(options={"game": i * 30}) for i, e in enumerate(envs)))
    elapsed = time.perf_counter() - start
    stop.set()
    await tick
    assert [i["game_index"] for _, i in infos] == [0, 30, 60, 90]
    assert len({i["task_type"] for _, i in infos}) >= 2
    # The loop kept ticking while the games loaded. Resets run on the loop would stall it for all of
    # `elapsed` in one gap (the four would run back to back before the ticker woke once); in worker
    # threads the ticker keeps waking. On a loaded machine the GIL goes to the loading threads for
    # long stretches (gaps over 0.1 s took 7.2 s of 12.3 with two other CPU-bound processes on the 2
    # cores, the longest 1.5 s), so the bounds are on the longest gap and the stalled share, both
    # relative to the measured time and far from the one-gap stall of resets on the loop.
    stalled = sum(g for g in gaps if g > 0.1)
    assert elapsed > 0.5 and max(gaps) < elapsed / 2 and stalled < 0.8 * elapsed, \
        (elapsed, stalled, sorted(gaps)[-5:])
    assert len(gaps) >= 10
    for e in envs:
        await e.close()
        await e.close()


async def test_keeps_the_env_contract(seen: list[GameRef]) -> None:
    from agentenv.checker import check_env

    report = await check_env(AlfWorldEnv(games=seen[:3], max_steps=3), actions=["look", "go to desk 1"])
    assert "step_before_reset_raises" in report.checks and report.steps >= 3
