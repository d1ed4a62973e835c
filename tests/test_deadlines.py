"""Per-episode and per-turn wall-clock deadlines: a straggler is truncated or requeued, never waited on."""

from __future__ import annotations

import asyncio
import time

import pytest

from agentenv.collector import RolloutCollector
from agentenv.errors import ConfigError
from agentenv.rollout import RolloutConfig, run_episode
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


@pytest.mark.parametrize("bad", [{"episode_deadline_s": 0}, {"turn_deadline_s": -1.0},
                                 {"turn_deadline_s": float("inf")}, {"on_deadline": "wait"}])
def test_bad_deadline_settings_are_config_errors(bad):
    with pytest.raises(ConfigError, match="deadline"):
        RolloutConfig(**bad)
