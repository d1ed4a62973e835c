"""A run that makes no update says so: a warning after ``no_update_warning_s`` of waiting, and again each as long."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from agentenv.rollout.collector import NoUpdateWatch, RolloutCollector
from agentenv.rollout.episode import RolloutConfig
from agentenv.trainer.batch_wait import next_batch
from tests.fakes import CharRenderer, CountdownEnv, FakeClock, ScriptedEngine


class StalledEnv(CountdownEnv):
    """Every step sleeps for a minute (an environment stuck on something)."""

    async def step(self, action):
        await asyncio.sleep(60)
        return await super().step(action)


def test_the_watch_warns_after_every_s_and_again_each_every_s(caplog):
    clock = FakeClock()
    watch = NoUpdateWatch(300.0, lambda: "2 episodes in flight", clock)
    with caplog.at_level(logging.WARNING, logger="agentenv.rollout.collector"):
        clock.now = 299.9
        watch.check("0 of 16 trajectories in the pool")
        assert watch.warnings == 0 and not caplog.records
        clock.now = 300.0
        watch.check("3 of 16 trajectories in the pool")
        clock.now = 450.0
        watch.check("3 of 16 trajectories in the pool")  # not again before 600 s
        clock.now = 601.0
        watch.check("5 of 16 trajectories in the pool")
    assert watch.warnings == 2
    assert [r.getMessage() for r in caplog.records] == [
        "no update for 300 s: 3 of 16 trajectories in the pool; 2 episodes in flight",
        "no update for 601 s: 5 of 16 trajectories in the pool; 2 episodes in flight",
    ]


def test_the_progress_report_counts_episodes_and_names_the_last_error():
    collector = RolloutCollector(CountdownEnv, ScriptedEngine(["done"]), CharRenderer(), RolloutConfig(),
                                 lambda t: None, concurrency=2)
    collector.episodes_started, collector.episodes_finished, collector.episodes_delivered = 7, 5, 3
    collector.in_flight = 2
    collector.episodes_failed, collector.stragglers, collector.failure_streak = 2, 1, 2
    collector.last_error = "straggler: episode deadline of 650 s passed in env"
    assert collector.progress_report() == (
        "2 episodes in flight, 5 finished, 3 delivered, 2 failed (1 past a deadline); failure streak 2; "
        "last error: straggler: episode deadline of 650 s passed in env")


async def test_the_training_loops_wait_for_a_batch_warns_while_an_environment_is_stuck(caplog):
    collector = RolloutCollector(StalledEnv, ScriptedEngine(["hm"]), CharRenderer(), RolloutConfig(),
                                 lambda t: None, concurrency=2)
    collector.no_update_warning_s = 0.2
    cfg = SimpleNamespace(staleness=SimpleNamespace(policy="max_lag", drift_mode="share"),
                          run=SimpleNamespace(concurrency=2, batch_size=4))
    stop = asyncio.Event()
    await collector.start()
    asyncio.get_running_loop().call_later(0.7, stop.set)
    with caplog.at_level(logging.WARNING, logger="agentenv.rollout.collector"):
        got = await asyncio.wait_for(next_batch([], SimpleNamespace(version=0), cfg, stop, print, collector), 10)
    await collector.close()
    assert got is None
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no update")]
    assert 2 <= len(warnings) <= 3, warnings  # at 0.2 s, 0.4 s, 0.6 s
    assert warnings[0].startswith("no update for 0 s: 0 of 4 trajectories in the pool; 2 episodes in flight")


async def test_synchronous_collection_warns_while_an_environment_is_stuck(caplog):
    collector = RolloutCollector(StalledEnv, ScriptedEngine(["hm"]), CharRenderer(), RolloutConfig(),
                                 lambda t: None, concurrency=1)
    collector.no_update_warning_s = 0.2
    with caplog.at_level(logging.WARNING, logger="agentenv.rollout.collector"):
        task = asyncio.ensure_future(collector.collect(1))
        await asyncio.sleep(0.5)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    await collector.close()
    warnings = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no update")]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("no update for 0 s: 0 of 1 trajectories collected; 1 episodes in flight")
