"""Evaluation: the pure report on hand-made results, and the concurrent runner with scripted agents."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest

from agentenv.core import Env, StepResult
from agentenv.errors import ConfigError, ResetNeeded
from agentenv.eval_command import main
from agentenv.evaluation import (
    EpisodeJob,
    EpisodeResult,
    aggregate,
    format_table,
    make_jobs,
    model_agent,
    policy_agent,
    run_jobs,
    write_report,
)
from agentenv.rollout.episode import RolloutConfig
from tests.fakes import CharRenderer, ScriptedEngine


def R(game: str, task: str, sample: int, won: bool, steps: int, error: str | None = None) -> EpisodeResult:
    return EpisodeResult(game, task, sample, won, float(won), steps, 1.0, error)


HAND = [
    # task A, game a1: won once in 3 samples; game a2: never (one sample errored).
    R("a1", "A", 0, True, 4),
    R("a1", "A", 1, False, 50),
    R("a1", "A", 2, False, 50),
    R("a2", "A", 0, False, 50),
    R("a2", "A", 1, False, 50),
    R("a2", "A", 2, False, 0, "DataError: x"),
    # task B, game b1: won twice.
    R("b1", "B", 0, True, 6),
    R("b1", "B", 1, True, 10),
    R("b1", "B", 2, False, 50),
]


def test_aggregate_on_hand_made_results() -> None:
    rep = aggregate(HAND, split="valid_seen", samples_per_game=3, task_order=["B", "C"], seconds=30.0)
    o = rep.overall
    assert (o.games, o.episodes, o.successes, o.errors) == (3, 9, 3, 1)
    assert o.success_rate == pytest.approx(3 / 9)
    assert o.pass_at_k == pytest.approx(2 / 3)  # a1 and b1 won at least once
    assert o.mean_steps == pytest.approx((4 + 50 + 50 + 50 + 50 + 0 + 6 + 10 + 50) / 9)
    assert o.mean_steps_won == pytest.approx((4 + 6 + 10) / 3)
    assert list(rep.per_task) == ["B", "C", "A"]  # the given order first (C has no episode), then the rest
    a, b, c = rep.per_task["A"], rep.per_task["B"], rep.per_task["C"]
    assert (a.games, a.episodes, a.successes, a.errors) == (2, 6, 1, 1)
    assert a.success_rate == pytest.approx(1 / 6) and a.pass_at_k == pytest.approx(1 / 2)
    assert b.success_rate == pytest.approx(2 / 3) and b.pass_at_k == 1.0 and b.mean_steps == pytest.approx(22)
    assert c.episodes == 0 and math.isnan(c.success_rate) and math.isnan(c.mean_steps)
    assert rep.episodes_per_minute == pytest.approx(18.0)  # 9 episodes in 30 s


def test_report_json_and_table() -> None:
    rep = aggregate(
        HAND, split="valid_seen", model="m", samples_per_game=3, task_order=["B", "C"], seconds=30.0
    )
    js = rep.to_json()
    assert js["per_task"]["C"]["success_rate"] is None  # NaN -> null
    assert js["overall"]["successes"] == 3
    json.dumps(js, allow_nan=False)
    table = format_table(rep)
    lines = table.splitlines()
    assert lines[0] == "alfworld valid_seen  model=m  K=3"
    row_b = next(line for line in lines if line.startswith("B "))
    assert row_b.split() == ["B", "1", "3", "2", "66.7", "100.0", "22.0", "0"]
    row_c = next(line for line in lines if line.startswith("C "))
    assert row_c.split() == ["C", "0", "0", "0", "-", "-", "-", "0"]
    overall = next(line for line in lines if line.startswith("overall"))
    assert overall.split()[:6] == ["overall", "3", "9", "3", "33.3", "66.7"]


def test_write_report(tmp_path: Path) -> None:
    rep = aggregate(HAND[:3], split="s", samples_per_game=3)
    path = write_report(rep, HAND[:3], tmp_path / "out")
    data = json.loads(path.read_text())
    assert data["overall"]["episodes"] == 3 and len(data["episodes"]) == 3
    assert (tmp_path / "out" / "report.txt").read_text().startswith("alfworld s")


def test_make_jobs() -> None:
    games = [("g0", "A"), ("g1", "B"), ("g2", "A")]
    jobs = make_jobs(games, samples_per_game=3, limit=2, seed=100)
    assert [(j.game_index, j.game, j.sample) for j in jobs] == [
        (0, "g0", 0),
        (0, "g0", 1),
        (0, "g0", 2),
        (1, "g1", 0),
        (1, "g1", 1),
        (1, "g1", 2),
    ]
    assert [j.seed for j in jobs] == list(range(100, 106))
    assert len(make_jobs(games)) == 3
    with pytest.raises(ConfigError):
        make_jobs(games, samples_per_game=0)
    with pytest.raises(ConfigError):
        make_jobs(games, limit=0)


class GuessEnv(Env[str, str]):
    """Game i is won by replying ``win i``; ``max_steps`` replies otherwise. Counts live instances."""

    live = 0
    peak = 0

    def __init__(self, max_steps: int = 3) -> None:
        self.max_steps = max_steps
        self.game = -1
        self.steps = 0
        GuessEnv.live += 1
        GuessEnv.peak = max(GuessEnv.peak, GuessEnv.live)

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self.game = int((options or {})["task"])
        if self.game == 13:
            raise ValueError("game 13 is cursed")
        self.steps = 0
        await asyncio.sleep(0.001)
        return f"Say win {self.game}.", {"task_type": "T", "steps": 0, "won": False}

    async def step(self, action: str) -> StepResult[str]:
        if self.game < 0:
            raise ResetNeeded("reset first")
        await asyncio.sleep(0.001)
        self.steps += 1
        won = action.strip() == f"win {self.game}"
        trunc = not won and self.steps >= self.max_steps
        info = {"task_type": "T", "steps": self.steps, "won": won}
        return StepResult("yes" if won else "no", float(won), won, trunc, info)

    async def close(self) -> None:
        if not self._closed:
            GuessEnv.live -= 1
        await super().close()


def _jobs(n: int) -> list[EpisodeJob]:
    return make_jobs([(f"g{i}", "T") for i in range(n)])


async def test_run_jobs_bounds_live_envs_and_isolates_failures() -> None:
    GuessEnv.live = GuessEnv.peak = 0

    def make_policy(job, info):
        async def policy(obs, info):  # wins the even games at the second step
            return f"win {job.game_index}" if job.game_index % 2 == 0 and info["steps"] == 1 else "hmm"

        return policy

    seen: list[EpisodeResult] = []
    results = await run_jobs(
        _jobs(20), policy_agent(make_policy), GuessEnv, concurrency=3, progress=False, on_result=seen.append
    )
    assert [r.game for r in results] == [f"g{i}" for i in range(20)]
    assert len(seen) == 20
    assert GuessEnv.peak == 3 and GuessEnv.live == 0  # bounded, and every env closed
    cursed = results[13]
    assert cursed.error == "ValueError: game 13 is cursed" and not cursed.won and cursed.ending == "error"
    for i, r in enumerate(results):
        if i != 13:
            expected = (True, 2, 1.0, "won") if i % 2 == 0 else (False, 3, 0.0, "truncated")
            assert (r.won, r.steps, r.reward, r.ending) == expected
    rep = aggregate(results)
    assert (rep.overall.successes, rep.overall.errors) == (10, 1)
    with pytest.raises(ConfigError):
        await run_jobs(_jobs(1), policy_agent(make_policy), GuessEnv, concurrency=0)


async def test_model_agent_plays_through_the_rollout_loop() -> None:
    engine = ScriptedEngine(["hmm", "win 0"])
    agent = model_agent(engine, CharRenderer(), RolloutConfig(max_turns=5, max_total_tokens=500))
    [res] = await run_jobs(_jobs(1), agent, GuessEnv, concurrency=1, progress=False)
    assert (res.won, res.steps, res.reward, res.error, res.ending) == (True, 2, 1.0, None, "won")
    broken = ScriptedEngine(["hmm"], fail_on=1)
    agent = model_agent(broken, CharRenderer(), RolloutConfig(max_turns=5, max_total_tokens=500))
    [res] = await run_jobs(_jobs(1), agent, GuessEnv, concurrency=1, progress=False)
    assert not res.won and res.error == "EngineError: engine died" and res.ending == "error"
    engine = ScriptedEngine(["hmm"])
    agent = model_agent(engine, CharRenderer(), RolloutConfig(max_turns=2, max_total_tokens=500))
    [res] = await run_jobs(_jobs(1), agent, GuessEnv, concurrency=1, progress=False)
    assert (res.won, res.steps, res.ending) == (False, 2, "max_turns")


def test_main_rejects_bad_input_cleanly(capsys) -> None:
    assert main(["--split", "valid_train", "--no-progress"]) == 2
    assert "unknown ALFWorld split 'valid_train'" in capsys.readouterr().err
    assert main(["--split", "valid_seen", "--samples-per-game", "0", "--no-progress"]) == 2
    said = " ".join(capsys.readouterr().err.replace("│", " ").split())  # tyro's message box, unwrapped
    assert "--samples-per-game 0: expected an integer >= 1" in said


def test_main_evaluates_any_env_that_declares_tasks(guess_number, monkeypatch, tmp_path, capsys) -> None:
    """``agentenv eval --env examples/GuessNumber-v0``: every secret is a task; always guessing 1 wins task 0."""
    from agentenv import eval_command

    engine = ScriptedEngine(["1"])
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (engine, CharRenderer()))
    argv = ["--env", guess_number, "--env-arg", "high=3", "--samples-per-game", "2", "--max-steps", "2",
            "--concurrency", "2", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["env"], report["split"]) == (guess_number, "")
    overall = report["overall"]
    assert (overall["games"], overall["episodes"], overall["successes"], overall["errors"]) == (3, 6, 2, 0)
    assert overall["pass_at_k"] == pytest.approx(1 / 3) and list(report["per_task"]) == [""]
    by_task = {(e["game"], e["sample"]): (e["won"], e["steps"], e["ending"]) for e in report["episodes"]}
    assert by_task[("secret-1", 0)] == by_task[("secret-1", 1)] == (True, 1, "won")
    # --max-steps is also the env's own max_turns: the env truncates after two wrong guesses
    assert by_task[("secret-3", 1)] == (False, 2, "truncated")
    assert "(no kind)" in capsys.readouterr().out


def test_without_max_steps_the_env_keeps_its_own_turn_limit(guess_number, monkeypatch, tmp_path) -> None:
    """No ``--max-steps``: GuessNumber's own ``max_turns=7`` ends a game that never guesses right after 7 guesses
    (not the rollout's cap of 50, which is not passed on to the env)."""
    from agentenv import eval_command

    assert eval_command.env_kwargs(eval_command.parse_args(["--env", guess_number])) == {}
    assert eval_command.env_kwargs(eval_command.parse_args(["--env", guess_number, "--max-steps", "3"])) == {
        "max_turns": 3}
    engine = ScriptedEngine(["0"])  # below every secret: never right
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (engine, CharRenderer()))
    argv = ["--env", guess_number, "--env-arg", "high=2", "--samples-per-game", "1", "--no-progress",
            "--out", str(tmp_path)]
    assert main(argv) == 0
    episodes = json.loads((tmp_path / "report.json").read_text())["episodes"]
    assert [(e["steps"], e["ending"]) for e in episodes] == [(7, "truncated")] * 2


def test_main_refuses_envs_without_tasks_and_arguments_they_do_not_take(guess_number, monkeypatch, capsys) -> None:
    import agentenv
    from agentenv.registration import EnvSpec

    spec = EnvSpec("tests/Repeat-v0", "tests.tiny_env:RepeatNumberEnv")
    monkeypatch.setitem(agentenv.registry, "tests/Repeat-v0", spec)
    assert main(["--env", guess_number, "--split", "valid_seen", "--no-progress"]) == 2
    assert "does not take 'split'; it takes: low, high, max_turns" in capsys.readouterr().err
    assert main(["--env", guess_number, "--env-arg", "high", "--no-progress"]) == 2
    assert "--env-arg 'high': expected KEY=VALUE" in capsys.readouterr().err
