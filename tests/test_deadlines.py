"""Per-episode and per-turn wall-clock deadlines: a straggler is truncated or requeued, never waited on."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentenv.errors import ConfigError
from agentenv.rollout.collector import RolloutCollector
from agentenv.rollout.episode import RolloutConfig, episode_deadline, run_episode
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine


class SlowTurnEngine(ScriptedEngine):
    """Replies like ScriptedEngine, but generation of reply ``slow_on`` takes ``delay`` seconds."""

    def __init__(self, replies, *, slow_on: int, delay: float):
        super().__init__(replies)
        self.slow_on, self.delay = slow_on, delay
        self.cancelled = 0

    async def generate(self, prompt_ids, params):
        if len(self.calls) == self.slow_on:
            self.calls.append(list(prompt_ids))
            try:
                await asyncio.sleep(self.delay)
            except asyncio.CancelledError:  # the engine's request is cancelled, not left running
                self.cancelled += 1
                raise
            raise AssertionError("the deadline should have cancelled this generation")
        return await super().generate(prompt_ids, params)


class SlowStepEnv(CountdownEnv):
    def __init__(self, delay: float):
        super().__init__(limit=10)
        self.delay = delay

    async def step(self, action):
        await asyncio.sleep(self.delay)
        return await super().step(action)


async def test_turn_deadline_truncates_keeping_finished_turns():
    engine = SlowTurnEngine(["hm", "done"], slow_on=1, delay=30.0)
    t0 = time.monotonic()
    traj = await run_episode(CountdownEnv(), engine, CharRenderer(), RolloutConfig(turn_deadline_s=0.2), seed=1)
    assert time.monotonic() - t0 < 5.0
    assert traj.status == "completed" and engine.cancelled == 1
    assert traj.info["truncation"] == "deadline" and traj.info["straggler"] == "turn"
    assert traj.info["turn_endings"] == ["end_of_turn", "deadline"]
    # the first turn ("hm" + EOT) is kept; the cancelled turn's tokens never were returned
    assert traj.num_policy_tokens == 3 and traj.info["turns"] == 1 and traj.reward == 0.0


async def test_episode_deadline_covers_environment_steps_and_requeue_fails_the_episode():
    cfg = RolloutConfig(episode_deadline_s=0.3, on_deadline="requeue")
    t0 = time.monotonic()
    traj = await run_episode(SlowStepEnv(delay=30.0), ScriptedEngine(["hm"]), CharRenderer(), cfg, seed=2)
    assert time.monotonic() - t0 < 5.0
    assert traj.status == "error" and traj.info["straggler"] == "episode"
    assert traj.info["error"].startswith("straggler: episode deadline of 0.3 s passed")


async def test_no_deadline_hit_changes_nothing():
    cfg = RolloutConfig(episode_deadline_s=30.0, turn_deadline_s=30.0)
    traj = await run_episode(CountdownEnv(), ScriptedEngine(["hm", "done"]), CharRenderer(), cfg, seed=3)
    assert traj.reward == 1.0 and "straggler" not in traj.info and traj.info["truncation"] is None


async def test_collector_counts_stragglers_and_replays_requeued_tasks():
    """Every first attempt is slow and requeued; the replays are fast: all tasks arrive, none waited on."""
    got = []
    engine = SlowTurnEngine(["done"], slow_on=0, delay=30.0)
    cfg = RolloutConfig(turn_deadline_s=0.2, on_deadline="requeue")
    collector = RolloutCollector(lambda: CountdownEnv(), engine, CharRenderer(), cfg, got.append,
                                 concurrency=1, max_retries=2)
    trajs = await asyncio.wait_for(collector.collect(3), timeout=20)
    assert len(trajs) == 3 and all(t.reward == 1.0 for t in trajs)
    counts = collector.report_counts()
    assert counts["stragglers"] == 1 and counts["retried"] == 1 and counts["stragglers_total"] == 1
    await collector.close()


class StuckEnvDeclaringADeadline(SlowStepEnv):
    """An environment whose steps stall (``delay`` seconds) and that declares a 0.3 s episode deadline."""

    episode_deadline_s = 0.3


async def test_an_environment_that_stalls_is_requeued_never_scored_under_the_default_on_deadline():
    cfg = RolloutConfig(episode_deadline_s=0.3)  # on_deadline: "truncate", the default
    assert cfg.on_deadline == "truncate"
    traj = await asyncio.wait_for(
        run_episode(SlowStepEnv(delay=30.0), ScriptedEngine(["hm"]), CharRenderer(), cfg, seed=2), timeout=5)
    assert traj.status == "error" and traj.info["deadline_in"] == "env" and traj.info["straggler"] == "episode"
    assert traj.info["error"] == "straggler: episode deadline of 0.3 s passed in env"


async def test_a_stall_in_generation_is_still_truncated_and_keeps_its_reward():
    engine = SlowTurnEngine(["hm", "done"], slow_on=1, delay=30.0)
    traj = await asyncio.wait_for(
        run_episode(CountdownEnv(), engine, CharRenderer(), RolloutConfig(episode_deadline_s=0.3), seed=1), timeout=5)
    assert traj.status == "completed" and traj.info["deadline_in"] == "generation"
    assert traj.info["truncation"] == "deadline" and traj.num_policy_tokens == 3 and engine.cancelled == 1


async def test_the_environments_declared_deadline_applies_unless_the_config_sets_one():
    t0 = time.monotonic()
    traj = await asyncio.wait_for(run_episode(StuckEnvDeclaringADeadline(delay=30.0), ScriptedEngine(["hm"]),
                                              CharRenderer(), RolloutConfig(), seed=2), timeout=5)
    assert 0.3 <= time.monotonic() - t0 < 5.0
    assert traj.status == "error" and traj.info["error"] == "straggler: episode deadline of 0.3 s passed in env"
    # the config's deadline wins over the env's: a step of 0.5 s fits in 30 s
    traj = await run_episode(StuckEnvDeclaringADeadline(delay=0.5), ScriptedEngine(["done"]), CharRenderer(),
                             RolloutConfig(episode_deadline_s=30.0), seed=2)
    assert traj.status == "completed" and traj.reward == 1.0 and "straggler" not in traj.info
    assert episode_deadline(RolloutConfig(), StuckEnvDeclaringADeadline(0.0)) == 0.3
    assert episode_deadline(RolloutConfig(episode_deadline_s=7.0), StuckEnvDeclaringADeadline(0.0)) == 7.0
    assert episode_deadline(RolloutConfig(), CountdownEnv()) is None


async def test_collector_replays_a_stalled_environments_task_and_delivers_only_scored_episodes():
    """The first attempt's env stalls (requeued); the replay's env answers: every task arrives, rewarded."""
    got, made = [], []

    def factory():
        made.append(1)
        return StuckEnvDeclaringADeadline(delay=30.0 if len(made) == 1 else 0.0)

    collector = RolloutCollector(factory, ScriptedEngine(["done"]), CharRenderer(), RolloutConfig(), got.append,
                                 concurrency=1, max_retries=2)
    trajs = await asyncio.wait_for(collector.collect(2), timeout=20)
    assert len(trajs) == 2 and all(t.reward == 1.0 and t.status == "completed" for t in trajs)
    counts = collector.report_counts()
    assert counts["stragglers"] == 1 and counts["failed"] == 1 and counts["retried"] == 1
    await collector.close()


def test_shipped_environments_declare_ten_times_their_expected_episode_time():
    from agentenv.envs.alfworld.env import AlfWorldEnv
    from agentenv.envs.python_tool import PythonToolEnv
    from agentenv.envs.python_tool.datasets import MathProblem

    problems = [MathProblem("t/0", "1+1?", "2", "t")]
    assert PythonToolEnv(problems=problems).episode_deadline_s == 10 * (4 * 15.0 + 5.0)
    assert PythonToolEnv(problems=problems, max_turns=2, grade_timeout_s=3.0).episode_deadline_s == 10 * (2 * 15 + 3)
    pytest.importorskip("alfworld")  # an AlfWorldEnv is built only with the alfworld packages installed
    assert AlfWorldEnv(games=[]).episode_deadline_s == 10 * (2.0 + 50 * 5.0)
    assert AlfWorldEnv(games=[], max_steps=4).episode_deadline_s == 10 * (2.0 + 4 * 5.0)


@pytest.mark.parametrize("bad", [{"episode_deadline_s": 0}, {"turn_deadline_s": -1.0},
                                 {"turn_deadline_s": float("inf")}, {"on_deadline": "wait"}])
def test_bad_deadline_settings_are_config_errors(bad):
    with pytest.raises(ConfigError, match="deadline"):
        RolloutConfig(**bad)
