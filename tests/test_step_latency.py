"""``agentenv.step_latency``: the delay's distribution from seeds, that it never blocks the loop, pass-through."""

from __future__ import annotations

import asyncio
import math
import statistics
import time

import numpy as np
import pytest

from agentenv.configio import apply_overrides, load_config
from agentenv.core import StepResult
from agentenv.errors import ConfigError
from agentenv.step_latency import StepLatency, StepLatencyConfig
from tests.tiny_env import RepeatNumberEnv


class FakeSleep:
    """Records the delays asked for and returns at once (asyncio time mocked)."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)


async def _play(env, seed, steps):
    await env.reset(seed=seed)
    for _ in range(steps):
        await env.step("wrong")  # RepeatNumberEnv(max_tries=steps) never ends early on a wrong answer


def test_the_median_and_the_tail_follow_the_lognormal_over_seeded_episodes():
    sleep = FakeSleep()
    env = StepLatency(RepeatNumberEnv(max_tries=5), StepLatencyConfig(median_s=2.0, sigma=1.0), sleep=sleep)

    async def run():
        for seed in range(400):
            await _play(env, seed, 4)

    asyncio.run(run())
    delays = sleep.asked
    assert len(delays) == 1600 and env.delays == delays[-4:]
    # log(delay) ~ N(log 2, 1): the sample median of 1600 is within a few % of 2 s (its standard error
    # is about 1.25 sigma / sqrt(n) = 3% in log space); 10% leaves room for any numpy's normals
    assert statistics.median(delays) == pytest.approx(2.0, rel=0.10)
    logs = np.log(delays)
    assert float(logs.mean()) == pytest.approx(math.log(2.0), abs=0.08)
    assert float(logs.std()) == pytest.approx(1.0, abs=0.08)
    # long tail: P(delay > 2 e^2.326) = 1%; the mean is 2 e^0.5 = 3.30 s, well above the median
    tail = sum(d > 2.0 * math.exp(2.326) for d in delays) / len(delays)
    assert 0.002 <= tail <= 0.025
    assert float(np.mean(delays)) == pytest.approx(2.0 * math.exp(0.5), rel=0.15)


def test_delays_are_reproducible_from_the_episode_seed_and_leave_the_env_rng_alone():
    cfg = StepLatencyConfig(median_s=0.5, sigma=0.8)

    def delays(seed):
        sleep = FakeSleep()
        env = StepLatency(RepeatNumberEnv(max_tries=3), cfg, sleep=sleep)
        obs = asyncio.run(env.reset(seed=seed))[0]
        for _ in range(3):
            asyncio.run(env.step("wrong"))
        return obs, sleep.asked

    obs7, d7 = delays(7)
    assert delays(7) == (obs7, d7)  # same seed, same delays
    assert delays(8)[1] != d7
    plain = RepeatNumberEnv()
    assert asyncio.run(plain.reset(seed=7))[0] == obs7  # the env's own draws are untouched by the wrapper
    # the hand-computed first delay: 0.5 * exp(0.8 z), z the first normal of the salted generator
    z = np.random.default_rng([7, 0x57E91A7]).standard_normal()
    assert d7[0] == pytest.approx(0.5 * math.exp(0.8 * z), rel=1e-12)
    sleep = FakeSleep()
    exact = StepLatency(RepeatNumberEnv(max_tries=3), StepLatencyConfig(median_s=0.25), sleep=sleep)
    asyncio.run(_play(exact, 1, 3))
    assert sleep.asked == [0.25, 0.25, 0.25]  # sigma 0: exactly the median


def test_the_delay_does_not_block_other_coroutines():
    cfg = StepLatencyConfig(median_s=0.2)  # real asyncio.sleep, sigma 0: 0.2 s per step

    async def run():
        envs = [StepLatency(RepeatNumberEnv(max_tries=3), cfg) for _ in range(3)]
        for i, e in enumerate(envs):
            await e.reset(seed=i)
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.create_task(ticker())
        t0 = time.monotonic()
        results = await asyncio.gather(*(e.step("wrong") for e in envs))
        elapsed = time.monotonic() - t0
        done.set()
        await tick
        return results, elapsed, ticks

    results, elapsed, ticks = asyncio.run(run())
    assert all(r.observation == "wrong, try again" for r in results)
    # three 0.2 s delays overlap (0.6 s if they blocked), and the ticker kept running meanwhile
    assert 0.2 <= elapsed < 0.45
    assert ticks >= 8


def test_results_and_attributes_pass_through_unchanged():
    class Scripted(RepeatNumberEnv):
        observation_role = "tool"
        tools = ({"type": "function", "function": {"name": "python"}},)
        result = StepResult("obs", 0.75, True, False, {"k": 1})
        reset_out = ("first", {"task_id": "t"})

        async def reset(self, *, seed=None, options=None):
            self.reset_args = (seed, options)
            return self.reset_out

        async def step(self, action):
            self.action = action
            return self.result

    inner = Scripted()
    env = StepLatency(inner, StepLatencyConfig(median_s=1.0, sigma=2.0), sleep=FakeSleep())
    assert asyncio.run(env.reset(seed=3, options={"task": 2})) is Scripted.reset_out
    assert inner.reset_args == (3, {"task": 2})
    assert asyncio.run(env.step("act")) is Scripted.result and inner.action == "act"
    assert env.observation_role == "tool" and env.tools is Scripted.tools and env.tasks() is None
    asyncio.run(env.close())
    asyncio.run(env.close())
    assert inner.closes == 2
    assert repr(env).startswith("<StepLatency(median_s=1.0, sigma=2.0) <Scripted>")


def test_bad_latency_is_a_config_error_naming_the_field():
    from agentenv.trainer.config import TrainConfig

    for field, bad in (("median_s", -0.5), ("sigma", -1.0), ("median_s", float("inf")), ("sigma", float("nan"))):
        with pytest.raises(ConfigError, match=f"env.step_latency.{field} must be a finite number >= 0"):
            StepLatencyConfig(**{field: bad})
    with pytest.raises(ConfigError, match=r"env.step_latency.median_s must be a finite number >= 0, got -2.0"):
        load_config(TrainConfig, apply_overrides({}, ["env.step_latency.median_s=-2.0"]))
    cfg = load_config(TrainConfig, apply_overrides({}, ["env.step_latency.median_s=1.5", "env.step_latency.sigma=1"]))
    assert cfg.env.step_latency == StepLatencyConfig(median_s=1.5, sigma=1.0)
    assert not TrainConfig().env.step_latency.enabled


def test_the_env_factory_wraps_every_training_env_only_when_enabled(monkeypatch):
    from agentenv.trainer import setup
    from agentenv.trainer.config import TrainConfig

    monkeypatch.setattr(setup, "make", lambda env_id, **kw: RepeatNumberEnv(**kw))
    on = load_config(TrainConfig, apply_overrides({}, ["env.id=anything", "env.kwargs.high=7",
                                                       "env.step_latency.median_s=0.1"]))
    env = setup.env_factory(on)()
    assert isinstance(env, StepLatency) and env.config.median_s == 0.1 and env.env.high == 7
    off = setup.env_factory(load_config(TrainConfig, apply_overrides({}, ["env.id=anything"])))()
    assert isinstance(off, RepeatNumberEnv)
