"""Time from a fault to recovery, for each injected fault, on the real parts.

* engine: a real ``TransformersEngine`` (tiny random Llama, 2 layers) under ``SupervisedEngine``; the
  decode thread is killed (``AGENTENV_FAULT=engine.decode:K``) with 4 requests in flight; measured: the
  rebuild (fault seen -> new engine serving the learner's weights) and fault -> next sampled reply.
* sandbox: a real ``process`` sandbox; its idle worker gets ``SIGKILL``; measured: the next call's
  ``SandboxError`` -> replacement ready (``sandbox_replaced``) and kill -> next successful call.
* environment: a ``RolloutCollector`` of 4 real ``PythonToolEnv`` episodes whose ``step`` raises
  (``AGENTENV_FAULT=python_tool.step:K``); measured: the slot's fresh environment built
  (``env_replaced``) and the failed episode's end -> its task played again and delivered.
* grader: a real math-verify grading worker gets ``SIGSTOP`` (hangs); measured: the hung grade -> kill
  at its deadline (``grader_kills``, deadline 1 s) and kill -> next verdict from a fresh worker.

Usage: ``python benchmarks/bench_faults.py [--repeats 5]``; prints one table (median and max seconds).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_soak import SOAK_PROBLEM, ToolScriptEngine  # noqa: E402  (benchmarks/, beside this file)

from agentenv.engines.base import SamplingParams  # noqa: E402
from agentenv.engines.supervised import SupervisedEngine, rebuild_from_learner  # noqa: E402
from agentenv.engines.transformers_engine import TransformersEngine  # noqa: E402
from agentenv.envs.python_tool import PythonToolEnv  # noqa: E402
from agentenv.envs.python_tool.grading import Grader  # noqa: E402
from agentenv.errors import EngineRebuilt, SandboxError  # noqa: E402
from agentenv.faults import FAULTS, InjectedFault, reset_fault_points  # noqa: E402
from agentenv.models import tiny_random_model  # noqa: E402
from agentenv.rollout.collector import RolloutCollector  # noqa: E402
from agentenv.rollout.episode import RolloutConfig  # noqa: E402
from agentenv.sandboxes import create_sandbox  # noqa: E402
from tests.fakes import CharRenderer  # noqa: E402


class _Learner:
    def __init__(self, model, version):
        self.model, self.version = model, version

    def weights_for_engine(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


async def engine_faults(repeats: int) -> tuple[list[float], list[float]]:
    learner = _Learner(tiny_random_model(seed=1), 1)
    sup = SupervisedEngine(TransformersEngine(tiny_random_model(seed=0), max_batch_size=4),
                           lambda dead: rebuild_from_learner(dead, learner, TransformersEngine), max_rebuilds=10 ** 6)
    params = SamplingParams(max_new_tokens=16)
    rebuild, serve = [], []
    for i in range(repeats):
        await sup.generate([1, 2, 3], params)  # warm
        os.environ["AGENTENV_FAULT"] = "engine.decode:3"
        reset_fault_points()
        n = len(FAULTS.events)
        out = await asyncio.gather(*(sup.generate([1, 2, 3, i], params) for _ in range(4)), return_exceptions=True)
        assert any(isinstance(o, EngineRebuilt) for o in out), out
        os.environ.pop("AGENTENV_FAULT")
        _, at, rec, _ = FAULTS.events[n]
        await sup.generate([1, 2, 3], params)
        rebuild.append(rec)
        serve.append(time.time() - at + rec)  # fault seen -> next reply
        learner.version += 1
    await sup.close()
    return rebuild, serve


async def sandbox_faults(repeats: int) -> tuple[list[float], list[float]]:
    sb = await create_sandbox("process")
    replaced, serve = [], []
    for _ in range(repeats):
        await sb.run("x = 1")
        pid = sb._handle.state.proc.pid  # the real worker process (bench only)
        n = FAULTS.total("sandbox_replaced")
        t0 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        await asyncio.sleep(0.05)  # the worker is dead before the next call, as between two tool calls
        try:
            await sb.run("print(1)")
            raise AssertionError("a dead worker was not detected")
        except SandboxError:
            pass
        res = await sb.run("print(2)")
        assert res.ok and res.stdout == "2\n", res
        serve.append(time.monotonic() - t0)
        while FAULTS.total("sandbox_replaced") == n:
            await asyncio.sleep(0.01)
        replaced.append(FAULTS.events[-1][2])
    await sb.close()
    return replaced, serve


FAILED: dict[int, float] = {}  # seed -> when its episode's environment raised


class CrashingEnv(PythonToolEnv):
    """The real PythonToolEnv, noting when an injected fault crashed a step (bench only)."""

    async def reset(self, *, seed=None, options=None):
        self._seed = seed
        return await super().reset(seed=seed, options=options)

    async def step(self, action):
        try:
            return await super().step(action)
        except InjectedFault:
            FAILED[self._seed] = time.time()
            raise


async def env_faults(repeats: int, grader: Grader) -> tuple[list[float], list[float]]:
    os.environ["AGENTENV_FAULT"] = ",".join(f"python_tool.step:{4 + 6 * k}" for k in range(repeats))
    reset_fault_points()
    delivered = {}
    collector = RolloutCollector(
        lambda: CrashingEnv(problems=[SOAK_PROBLEM], sandbox_backend="process", grader=grader, pool_size=0),
        ToolScriptEngine(delay_s=0.02), CharRenderer(), RolloutConfig(max_turns=4, max_total_tokens=4096),
        lambda traj: delivered.setdefault(traj.info["seed"], traj), concurrency=4)
    n = len(FAULTS.events)
    for traj in await collector.collect(8 * repeats):
        delivered.setdefault(traj.info["seed"], traj)
    await collector.close()
    os.environ.pop("AGENTENV_FAULT")
    replaced = [e[2] for e in FAULTS.events[n:] if e[0] == "env_replaced"]
    replay = [delivered[s].completion_time - t for s, t in FAILED.items() if s in delivered]
    return replaced, replay


def grader_faults(repeats: int) -> tuple[list[float], list[float]]:
    kills, serve = [], []
    with Grader(workers=1) as grader:
        for _ in range(repeats):
            assert grader.grade("\\boxed{42}", "42").correct
            (worker,) = grader._idle  # the real worker process (bench only)
            os.kill(worker.proc.pid, signal.SIGSTOP)
            r = grader.grade("\\boxed{42}", "42", timeout_s=1.0)
            assert r.fault == "timeout", r
            t_kill = time.monotonic()
            kills.append(FAULTS.events[-1][2])
            assert grader.grade("\\boxed{42}", "42").correct
            serve.append(time.monotonic() - t_kill)
    return kills, serve


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):7.3f} {max(xs):7.3f}  (n={len(xs)})" if xs else "   -"


async def main(repeats: int) -> None:
    rows = [("engine: rebuild (fault -> new engine serving)", "engine: fault -> next reply")]
    e = await engine_faults(repeats)
    s = await sandbox_faults(repeats)
    with Grader(workers=2) as grader:
        v = await env_faults(repeats, grader)
    g = await asyncio.to_thread(grader_faults, repeats)
    print(f"{'fault':<58} {'median':>7} {'max':>7}   seconds")
    for (a, b), (x, y) in zip(
            rows + [("sandbox: replacement ready (dead worker seen -> hello)", "sandbox: kill -> next successful call"),
                    ("env: fresh environment built", "env: failed episode -> its task delivered"),
                    ("grader: hung grade -> killed (deadline 1 s)", "grader: kill -> next verdict (fresh worker)")],
            [e, s, v, g], strict=True):
        print(f"{a:<58} {fmt(x)}")
        print(f"{b:<58} {fmt(y)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="faults injected of each kind")
    asyncio.run(main(ap.parse_args().repeats))
