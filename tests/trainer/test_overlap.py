"""Busy time of the engine, the environments and the learner, and the overlap bound of a run.

The pure parts (:func:`overlap`, :class:`LoopBusy`, :class:`BusyTrackingEnv`) run on hand-made clocks
and hand-computed figures; then ``trainer.train.train()`` runs for real (collector, pool, the real
TransformersEngine and single-process Learner on a random 1-layer Llama, a one-step environment
with a 5 ms "tool call") in both modes, and the logged figures are checked against the summary.
"""

from __future__ import annotations

import asyncio
import json
from typing import ClassVar

import pytest

from agentenv.core import Env, StepResult
from agentenv.engines.busy import BusyClock
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from agentenv.trainer.overlap import BusyTrackingEnv, LoopBusy, overlap, timed_env_factory
from agentenv.trainer.setup import LoopParts
from tests.fakes import CharRenderer, FakeClock, tiny_llama

pytestmark = pytest.mark.timeout(120)


# -- the bound -------------------------------------------------------------------------------------
def test_overlap_from_hand_computed_totals():
    # S = 4 + 2 + 3 = 9 s; the engine is the longest part (4 s); the loop took 5 s
    assert overlap(4.0, 2.0, 3.0, 5.0) == pytest.approx({
        "overlap/bound": 9 / 4, "overlap/achieved": 9 / 5, "overlap/of_bound": 4 / 5,
        "overlap/engine_s": 4.0, "overlap/env_s": 2.0, "overlap/learner_s": 3.0, "overlap/wall_s": 5.0})
    serial = overlap(2.0, 1.0, 3.0, 6.0)  # one part after the other: wall = sum
    assert (serial["overlap/bound"], serial["overlap/achieved"], serial["overlap/of_bound"]) == (2.0, 1.0, 0.5)
    perfect = overlap(3.0, 3.0, 3.0, 3.0)  # three equal parts, all the time
    assert (perfect["overlap/bound"], perfect["overlap/achieved"], perfect["overlap/of_bound"]) == (3.0, 3.0, 1.0)
    alone = overlap(2.0, 0.0, 0.0, 4.0)  # one part only: nothing to overlap, busy half the time
    assert (alone["overlap/bound"], alone["overlap/achieved"], alone["overlap/of_bound"]) == (1.0, 0.5, 0.5)


@pytest.mark.parametrize("wall_s", [0.0, 2.0])
def test_overlap_of_an_idle_loop(wall_s):
    out = overlap(0.0, 0.0, 0.0, wall_s)
    assert (out["overlap/bound"], out["overlap/achieved"], out["overlap/of_bound"]) == (1.0, 0.0, 0.0)


def test_overlap_refuses_impossible_figures():
    with pytest.raises(ValueError, match=">= 0"):
        overlap(-1.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        overlap(0.0, 0.0, 0.0, -1.0)
    with pytest.raises(ValueError, match="exceeds the wall-clock"):
        overlap(1.5, 0.0, 0.0, 1.0)
    assert overlap(1.0 + 1e-7, 0.0, 0.0, 1.0)["overlap/bound"] == 1.0  # rounding is tolerated


# -- the clocks ------------------------------------------------------------------------------------
def test_loop_busy_counts_from_its_start():
    t = FakeClock()
    engine = BusyClock(t)
    engine.start()
    t.now = 5.0  # a held-out evaluation before the loop: not counted
    engine.stop()
    busy = LoopBusy(engine, t)
    with pytest.raises(RuntimeError, match="before start"):
        busy.figures()
    busy.start()
    engine.start()
    busy.env.start()
    t.now = 6.0
    busy.env.stop()
    with busy.learner.running():
        t.now = 8.0
    assert busy.figures() == {"busy/engine_s": 3.0, "busy/env_s": 1.0, "busy/learner_s": 2.0, "busy/wall_s": 3.0}
    t.now = 9.0  # the engine still generating: its running stretch counts
    assert busy.figures() == {"busy/engine_s": 4.0, "busy/env_s": 1.0, "busy/learner_s": 2.0, "busy/wall_s": 4.0}


def test_running_stops_the_clock_when_the_block_raises():
    t = FakeClock()
    clock = BusyClock(t)
    with pytest.raises(KeyError), clock.running():
        t.now = 2.0
        raise KeyError("x")
    t.now = 10.0
    assert clock.busy_seconds == 2.0


class GatedEnv(Env[str, str]):
    """Each call waits for its gate; ``step`` raises on "boom"."""

    tools = ({"name": "python"},)

    def __init__(self) -> None:
        self.gate = asyncio.Event()

    async def reset(self, *, seed=None, options=None):
        await self.gate.wait()
        return "obs", {"task_id": str(seed)}

    async def step(self, action):
        await self.gate.wait()
        if action == "boom":
            raise RuntimeError("boom")
        return StepResult("", 1.0, True, False, {})


def test_environment_calls_in_flight_together_count_once():
    t = FakeClock()
    clock = BusyClock(t)
    make = timed_env_factory(GatedEnv, clock)
    a, b = make(), make()
    assert isinstance(a, BusyTrackingEnv) and a.env is not b.env and a.clock is b.clock is clock
    assert a.tools == ({"name": "python"},)  # other attributes reach the environment

    async def main():
        reset_a = asyncio.ensure_future(a.reset(seed=1))
        await asyncio.sleep(0)  # A in flight from t = 0
        t.now = 1.0
        step_b = asyncio.ensure_future(b.step("boom"))
        await asyncio.sleep(0)  # B in flight from t = 1
        t.now = 3.0
        a.env.gate.set()
        assert (await reset_a)[1] == {"task_id": "1"}  # A ends at t = 3
        t.now = 4.0
        b.env.gate.set()
        with pytest.raises(RuntimeError, match="boom"):  # B ends at t = 4, raising
            await step_b
        t.now = 7.0  # idle
        await a.close()  # instantaneous

    asyncio.run(main())
    assert clock.busy_seconds == 4.0  # from 0 to 4 (not 3 + 3), nothing after the error


# -- the real loop ---------------------------------------------------------------------------------
class SlowToolEnv(Env[str, str]):
    """One step; reward 1.0 for an even first character. The step waits 5 ms (a tool call)."""

    cut_turn: ClassVar[str] = "act"

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        return "pick", {"task_id": f"even-{seed}"}

    async def step(self, action):
        await asyncio.sleep(0.005)
        return StepResult("", 1.0 if action and ord(action[0]) % 2 == 0 else 0.0, True, False, {})


OVERRIDES = ["warmup.steps=0", "eval.problems=0", "run.batch_size=8", "run.concurrency=8", "run.max_pool_size=16",
             "run.checkpoint_every=1000", "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=2",
             "rollout.max_total_tokens=8", "learner.micro_batch_size=8", "objective.delta=5.0",
             "optim.step_on_zero_gradient=true", "learner.gradient_checkpointing=false", "staleness.policy=pace",
             "staleness.drift_mode=token_share", "model.max_batch_size=8", "run.seed=0", "run.updates=3"]
KEYS = ("busy/engine_s", "busy/env_s", "busy/learner_s")


def run_loop(tmp_path, policy):
    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_llama(), None, CharRenderer()),
                      env_factory=lambda cfg, *_: SlowToolEnv)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / policy), *OVERRIDES, f"staleness.policy={policy}"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 100))
    assert summary["updates"] == 3 and not summary["interrupted"]
    saved = json.loads((run_dir / "summary.json").read_text())
    assert saved["overlap/bound"] == summary["overlap/bound"]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3
    for key in (*KEYS, "busy/wall_s"):
        figures = [r[key] for r in rows]
        assert figures[0] > 0 and figures == sorted(figures), (key, figures)  # positive, cumulative
        assert 0 <= summary[key.replace("busy/", "overlap/")] - figures[-1] < 1.0  # the loop ends right after
    for r in rows:
        assert all(r[k] <= r["busy/wall_s"] for k in KEYS), r
        assert r["engine/busy_share"] == pytest.approx(r["busy/engine_s"] / r["busy/wall_s"])
    # the learner's busy span holds its steps (time/update_s) and the weight copies after them
    assert rows[-1]["busy/learner_s"] >= 0.99 * sum(r["time/update_s"] for r in rows)
    totals = [summary[k] for k in ("overlap/engine_s", "overlap/env_s", "overlap/learner_s", "overlap/wall_s")]
    expected = overlap(*totals)
    assert {k: summary[k] for k in expected} == pytest.approx(expected)
    assert summary["overlap/bound"] == pytest.approx(sum(totals[:3]) / max(totals[:3]))
    assert summary["overlap/achieved"] == pytest.approx(sum(totals[:3]) / totals[3])
    assert 1.0 <= summary["overlap/bound"] <= 3.0 and 0 < summary["overlap/achieved"] <= summary["overlap/bound"]
    return rows, summary


def test_the_async_loop_logs_its_busy_time_and_overlap_bound(tmp_path):
    run_loop(tmp_path, "pace")


def test_in_sync_mode_the_learner_never_overlaps_generation(tmp_path):
    rows, summary = run_loop(tmp_path, "sync")
    # the engine and the environments work only while a batch is collected, the learner only after it
    for part in ("overlap/engine_s", "overlap/env_s"):
        assert summary[part] + summary["overlap/learner_s"] <= summary["overlap/wall_s"] + 1e-9
    assert summary["overlap/achieved"] <= 2.0 + 1e-9  # at most the engine and environments together
