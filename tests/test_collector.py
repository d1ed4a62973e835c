"""The rollout collector: concurrent episodes, groups, retries, dropped tasks, requeues, the failure rule."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.errors import AgentEnvError, ConfigError, DataError
from agentenv.rollout.collector import RolloutCollector, failure_reason
from agentenv.rollout.episode import RolloutConfig
from agentenv.trajectory import Trajectory
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine

pytestmark = pytest.mark.timeout(60)


def _collector(env_factory, engine, out, **kw) -> RolloutCollector:
    return RolloutCollector(env_factory, engine, CharRenderer(), RolloutConfig(max_turns=3), out.append, **kw)


class FailingResetEnv(CountdownEnv):
    """Reset raises for the seeds in ``fail`` (``{seed: times}``, None: always), or for every seed
    when ``fail`` is None. Plays are counted per seed across instances (envs are rebuilt on failure)."""

    calls: dict[int, int] = {}

    def __init__(self, fail=None):
        super().__init__()
        self.fail = fail

    async def reset(self, *, seed=None, options=None):
        n = FailingResetEnv.calls[seed] = FailingResetEnv.calls.get(seed, 0) + 1
        times = None if self.fail is None else self.fail.get(seed, 0)
        if self.fail is None or seed in self.fail and (times is None or n <= times):
            raise RuntimeError(f"reset exploded on {seed}")
        return await super().reset(seed=seed, options=options)


@pytest.fixture(autouse=True)
def _fresh_counts():
    FailingResetEnv.calls = {}


async def _until(cond, seconds=5.0):
    for _ in range(int(seconds / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


async def test_sync_collect_plays_exactly_n_tasks_in_seed_order():
    out: list = []
    c = _collector(CountdownEnv, ScriptedEngine(["done"]), out, concurrency=2, first_seed=10)
    trajs = await c.collect(5)
    assert [t.info["seed"] for t in trajs] == [10, 11, 12, 13, 14]
    assert all(t.reward == 1.0 for t in trajs)
    assert (c.episodes_finished, c.errors, c.failure_streak, c.next_seed) == (5, 0, 0, 15)
    assert out == []  # collect returns its trajectories; it does not hand them on
    await c.close()


async def test_a_failed_task_is_replayed_then_dropped_and_never_returned():
    out: list = []
    # seed 1 always fails; seed 2 fails once, then works
    c = _collector(lambda: FailingResetEnv({1: None, 2: 1}), ScriptedEngine(["done"]), out,
                   concurrency=1, max_retries=2)
    trajs = await c.collect(3)
    assert [t.info["seed"] for t in trajs] == [0, 2, 3]  # task 1 dropped, replaced by task 3
    assert all(t.status == "completed" and t.num_policy_tokens > 0 for t in trajs)
    assert trajs[1].info["attempt"] == 1  # seed 2 succeeded on its replay
    assert FailingResetEnv.calls[1] == 3  # played 1 + max_retries times
    assert (c.episodes_failed, c.episodes_retried, c.tasks_dropped) == (4, 3, 1)
    assert c.failure_streak == 0 and "reset exploded on" in c.last_error
    counts = c.report_counts()
    assert (counts["failed"], counts["retried"], counts["dropped_tasks"]) == (4, 3, 1)
    assert c.report_counts()["failed"] == 0 and c.report_counts()["failed_total"] == 4  # per report
    await c.close()


async def test_sync_collect_with_a_broken_env_stops_at_the_failure_limit():
    out: list = []
    c = _collector(lambda: CountdownEnv(raise_on_step=True), ScriptedEngine(["a"]), out, concurrency=2,
                   failure_limit=7)
    with pytest.raises(AgentEnvError, match=r"last 7 episodes all failed.*env exploded"):
        await asyncio.wait_for(c.collect(4), 10)
    assert c.fatal is not None and c.failure_streak == 7
    with pytest.raises(AgentEnvError):  # sticky
        await c.collect(1)
    await c.close()


async def test_failure_streak_resets_on_a_good_episode():
    out: list = []
    engine = ScriptedEngine(["a", "done"], fail_on=0)  # the first generate call dies, the rest work
    c = _collector(CountdownEnv, engine, out, concurrency=1, max_retries=0)
    first = await c.collect(1)  # task 0 dropped at its first failure; task 1 replaces it
    assert [t.info["seed"] for t in first] == [1] and first[0].status == "completed"
    assert c.failure_streak == 0 and c.tasks_dropped == 1 and c.episodes_failed == 1
    assert "engine died" in c.last_error
    await c.close()


def test_failure_reason_empty_completion_and_errors():
    assert failure_reason(Trajectory(status="error", info={"error": "EngineError: x"})) == "EngineError: x"
    assert "no policy token" in failure_reason(Trajectory(info={"truncation": "context"}))
    t = Trajectory()
    t.append_environment_tokens([1, 2])
    t.append_policy_tokens([1000], [-0.1], 0, 0)  # only the stop token: the policy's choice, kept
    assert failure_reason(t) is None


async def test_a_prompt_longer_than_the_context_is_a_failure_not_a_trajectory():
    out: list = []
    c = _collector(CountdownEnv, ScriptedEngine(["done"], max_context_tokens=4), out, concurrency=1,
                   failure_limit=5)
    with pytest.raises(AgentEnvError, match="no policy token"):
        await asyncio.wait_for(c.collect(1), 10)
    await c.close()


async def test_async_workers_fill_the_pool_and_requeued_tasks_come_first():
    out: list = []
    c = _collector(CountdownEnv, ScriptedEngine(["done"]), out, concurrency=2,
                   admit=lambda: len(out) < 6)
    await c.start()
    await _until(lambda: len(out) >= 6, 2)
    await c.stop()
    assert len(out) >= 6 and len({t.info["seed"] for t in out}) == len(out)
    c.requeue(out[0])
    again = await c.collect(1)
    assert again[0].info["seed"] == out[0].info["seed"]
    await c.close()


async def test_async_failed_episodes_are_never_handed_on():
    out: list = []
    flaky = {0, 3, 4}  # these seeds always fail (dropped); seed 5 fails once (replayed)
    c = _collector(lambda: FailingResetEnv({0: None, 3: None, 4: None, 5: 1}), ScriptedEngine(["done"]), out,
                   concurrency=3, admit=lambda: len(out) < 8)
    await c.start()
    await _until(lambda: len(out) >= 8)
    await c.stop()
    assert all(t.status == "completed" and t.num_policy_tokens > 0 for t in out)
    seeds = {t.info["seed"] for t in out}
    assert not seeds & flaky
    assert c.tasks_dropped == 3 and c.episodes_failed == 10 and c.episodes_retried == 7 and c.fatal is None
    await c.close()


async def test_a_worker_survives_on_trajectory_raising_once():
    out: list = []
    calls = {"n": 0}

    def add(traj):
        calls["n"] += 1
        if calls["n"] == 1:
            raise DataError("pool refused it")
        out.append(traj)

    c = RolloutCollector(CountdownEnv, ScriptedEngine(["done"]), CharRenderer(), RolloutConfig(max_turns=3), add,
                         concurrency=1, admit=lambda: len(out) < 3)
    await c.start()
    await _until(lambda: len(out) >= 3)
    await c.stop()
    assert c.delivery_errors == 1 and c.episodes_discarded == 1 and c.worker_restarts == 0
    assert c.failure_streak == 0 and "pool refused it" in c.last_error
    await c.close()


async def test_a_crashed_worker_is_restarted():
    out: list = []
    state = {"n": 0}

    def admit():
        state["n"] += 1
        if state["n"] == 2:
            raise RuntimeError("admission check broke")
        return len(out) < 3

    c = _collector(CountdownEnv, ScriptedEngine(["done"]), out, concurrency=1, admit=admit)
    await c.start()
    await _until(lambda: len(out) >= 3)
    await c.stop()
    assert c.worker_restarts == 1 and "admission check broke" in c.last_error and c.failure_streak == 0
    await c.close()


async def test_async_broken_env_sets_fatal_and_workers_stop():
    out: list = []
    c = _collector(lambda: FailingResetEnv(), ScriptedEngine(["done"]), out, concurrency=4)
    await c.start()
    await _until(lambda: c.fatal is not None)
    assert c.failure_streak == c.failure_limit == 16 and "reset exploded" in str(c.fatal)
    await _until(lambda: all(w is None or w.done() for w in c._workers))  # noqa: SLF001
    assert out == []
    await c.close()


async def test_groups_play_one_task_n_times_and_arrive_whole():
    groups: list = []
    c = RolloutCollector(CountdownEnv, ScriptedEngine(["done", "no"]), CharRenderer(), RolloutConfig(max_turns=1),
                         None, on_group=groups.append, concurrency=3, group_size=4,
                         admit=lambda: len(groups) < 3)
    await c.start()
    await _until(lambda: len(groups) >= 3)
    await c.stop()
    for g in groups:
        assert len(g) == 4 and len({t.task_id for t in g}) == 1 and len({t.info["group"] for t in g}) == 1
        assert sorted(t.info["member"] for t in g) == [0, 1, 2, 3]
        assert len({tuple(t.token_ids[: t.prompt_length]) for t in g}) == 1  # the same prompt
    # requeue: only the first member puts the task back, once
    for t in groups[0]:
        c.requeue(t)
    assert c.state_dict()["requeued"] == [groups[0][0].info["seed"]]
    again = await c.collect(12)  # groups the stop cut short are finished first (at most 2 here), then the requeued
    assert groups[0][0].info["seed"] in {t.info["seed"] for t in again}
    assert all(len({t.info["seed"] for t in again[i : i + 4]}) == 1 for i in range(0, 12, 4))
    with pytest.raises(ConfigError):
        await c.collect(6)
    await c.close()


async def test_a_dropped_member_drops_its_group():
    out: list = []
    # seed 0 fails on every play: its group of 2 is dropped; the next tasks fill the request
    c = RolloutCollector(lambda: FailingResetEnv({0: None}), ScriptedEngine(["done"]), CharRenderer(),
                         RolloutConfig(max_turns=1), out.append, concurrency=2, group_size=2, max_retries=1)
    trajs = await c.collect(4)
    assert [t.info["seed"] for t in trajs] == [1, 1, 2, 2]
    assert c.tasks_dropped == 1 and out == []
    await c.close()


def test_constructor_errors():
    args = (CountdownEnv, ScriptedEngine(["a"]), CharRenderer(), RolloutConfig())
    for kw in ({"concurrency": 0}, {"group_size": 0}, {"max_retries": -1}, {"failure_limit": 0}):
        with pytest.raises(ConfigError):
            RolloutCollector(*args, print, **kw)
    with pytest.raises(ConfigError):
        RolloutCollector(*args, None)


class HeldEngine(ScriptedEngine):
    """Replies "done" once ``release`` is set: episodes stay in flight until then."""

    def __init__(self) -> None:
        super().__init__(["done"])
        self.release = asyncio.Event()

    async def generate(self, prompt_ids, params):
        await self.release.wait()
        return await super().generate(prompt_ids, params)


async def test_episodes_in_flight_count_against_the_pools_cap():
    """Admission on waiting + in flight (the trainer's rule): the pool never holds more than the cap."""
    out: list = []
    engine = HeldEngine()
    c = _collector(CountdownEnv, engine, out, concurrency=4, admit=lambda: len(out) + c.in_flight < 6)
    await c.start()
    await _until(lambda: c.in_flight == 4)
    assert out == [] and c.episodes_started == 4
    engine.release.set()
    await _until(lambda: len(out) == 6)
    await asyncio.sleep(0.2)  # the workers keep asking; none may start another episode
    assert len(out) == 6 and c.in_flight == 0 and c.episodes_started == 6
    out.clear()  # the learner took a batch: play resumes up to the cap again
    await _until(lambda: len(out) == 6)
    await c.stop()
    assert c.in_flight == 0 and c.episodes_started == 12
    await c.close()
