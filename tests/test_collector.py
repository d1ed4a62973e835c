"""The rollout collector: concurrent episodes, retries, requeues and the failure streak."""

from __future__ import annotations

import asyncio

from agentenv.collector import RolloutCollector
from agentenv.rollout import RolloutConfig
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine


def _collector(env_factory, engine, out, **kw) -> RolloutCollector:
    return RolloutCollector(env_factory, engine, CharRenderer(), RolloutConfig(max_turns=3), out.append, **kw)


async def test_sync_collect_plays_exactly_n_tasks_in_seed_order():
    out: list = []
    c = _collector(CountdownEnv, ScriptedEngine(["done"]), out, concurrency=2, first_seed=10)
    trajs = await c.collect(5)
    assert [t.info["seed"] for t in trajs] == [10, 11, 12, 13, 14]
    assert all(t.reward == 1.0 for t in trajs)
    assert (c.episodes_finished, c.errors, c.failure_streak, c.next_seed) == (5, 0, 0, 15)
    await c.close()


async def test_a_failed_episode_is_retried_once_then_handed_on_and_counted():
    out: list = []
    c = _collector(lambda: CountdownEnv(raise_on_step=True), ScriptedEngine(["a"]), out, concurrency=1)
    trajs = await c.collect(2)
    assert [t.status for t in trajs] == ["error", "error"]
    assert [t.info["attempt"] for t in trajs] == [1, 1]
    assert c.errors == 4  # two attempts each
    assert c.failure_streak == 4 and "env exploded" in c.last_error
    await c.close()


async def test_failure_streak_resets_on_a_good_episode():
    out: list = []
    engine = ScriptedEngine(["a", "done"], fail_on=0)  # the first generate call dies, the rest work
    c = _collector(CountdownEnv, engine, out, concurrency=1, max_retries=0)
    first = await c.collect(1)
    assert first[0].status == "error" and c.failure_streak == 1
    second = await c.collect(1)
    assert second[0].status == "completed" and c.failure_streak == 0
    await c.close()


async def test_async_workers_fill_the_pool_and_requeued_tasks_come_first():
    out: list = []
    c = _collector(CountdownEnv, ScriptedEngine(["done"]), out, concurrency=2,
                   admit=lambda: len(out) < 6)
    await c.start()
    for _ in range(200):  # bounded: at most 2 s
        if len(out) >= 6:
            break
        await asyncio.sleep(0.01)
    await c.stop()
    assert len(out) >= 6 and len({t.info["seed"] for t in out}) == len(out)
    c.requeue(out[0])
    again = await c.collect(1)
    assert again[0].info["seed"] == out[0].info["seed"]
    await c.close()
