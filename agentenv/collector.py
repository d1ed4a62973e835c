"""Many concurrent episodes feeding a pool: the rollout side of the asynchronous loop.

A :class:`RolloutCollector` runs ``concurrency`` worker coroutines, each owning one environment
and playing episodes back to back through :func:`agentenv.rollout.run_episode`. Tasks are seeds
drawn in order from a seeded stream; a rejected trajectory's task can be put back with
:meth:`RolloutCollector.requeue`. In asynchronous mode the workers run while the learner trains;
in synchronous mode :meth:`RolloutCollector.collect` plays exactly ``n`` episodes and returns.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from agentenv.core import Env
from agentenv.engines.base import GenerationEngine
from agentenv.errors import ConfigError
from agentenv.rollout import Renderer, RolloutConfig, run_episode
from agentenv.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Task:
    """One task to play: the reset seed that picks it (and counts its retries)."""

    seed: int
    attempt: int = 0


class RolloutCollector:
    """Runs episodes concurrently and hands each finished trajectory to ``on_trajectory``.

    Args:
        env_factory: Builds one environment per worker (called ``concurrency`` times).
        engine: The shared generation engine (batches across workers).
        renderer: Chat renderer of the engine's tokenizer.
        cfg: Per-episode budgets and sampling.
        on_trajectory: Receives every finished trajectory (the pool's ``add``), errors included.
        concurrency: Episodes in flight at once.
        version_fn: The learner's current policy version.
        first_seed: Seed of the first task; task k uses ``first_seed + k``.
        admit: Back-pressure: a worker starts a new episode only while this returns True.
        max_retries: An episode that ended with an engine or environment error is replayed this
            many times before its error trajectory is handed on.

    Attributes:
        episodes_started / episodes_finished / errors: Counters (``errors`` includes retried attempts).
        failure_streak: Episodes (retries included) that ended in error since the last one that did
            not; a trainer stops when this grows past any plausible run of bad luck (a broken
            environment or engine would otherwise leave it waiting for a batch forever).
        last_error: The error message of the latest failed episode (None before any).
    """

    def __init__(
        self,
        env_factory: Callable[[], Env],
        engine: GenerationEngine,
        renderer: Renderer,
        cfg: RolloutConfig,
        on_trajectory: Callable[[Trajectory], None | Awaitable[None]],
        *,
        concurrency: int = 8,
        version_fn: Callable[[], int] | None = None,
        first_seed: int = 0,
        admit: Callable[[], bool] | None = None,
        max_retries: int = 1,
    ) -> None:
        if concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
        self._env_factory = env_factory
        self._engine = engine
        self._renderer = renderer
        self._cfg = cfg
        self._on_trajectory = on_trajectory
        self._concurrency = concurrency
        self._version_fn = version_fn
        self._next_seed = first_seed
        self._admit = admit or (lambda: True)
        self._max_retries = max_retries
        self._requeued: collections.deque[Task] = collections.deque()
        self._workers: list[asyncio.Task] = []
        self._envs: list[Env] = []
        self._stopping = False
        self.episodes_started = 0
        self.episodes_finished = 0
        self.errors = 0
        self.failure_streak = 0  # episodes (retries included) ended in error since the last good one
        self.last_error: str | None = None

    # -- tasks ----------------------------------------------------------------------------------
    def _next_task(self) -> Task:
        if self._requeued:
            return self._requeued.popleft()
        task = Task(self._next_seed)
        self._next_seed += 1
        return task

    def requeue(self, traj: Trajectory) -> None:
        """Put the task of ``traj`` (e.g. rejected as too stale) back in front of the queue."""
        seed = traj.info.get("seed")
        if seed is not None:
            self._requeued.append(Task(int(seed)))

    @property
    def next_seed(self) -> int:
        """Seed of the next fresh task (saved in checkpoints)."""
        return self._next_seed

    @next_seed.setter
    def next_seed(self, value: int) -> None:
        self._next_seed = value

    # -- episodes -------------------------------------------------------------------------------
    async def _play(self, env: Env, task: Task) -> Trajectory:
        self.episodes_started += 1
        traj = await run_episode(
            env, self._engine, self._renderer, self._cfg, seed=task.seed, version_fn=self._version_fn
        )
        traj.info["seed"] = task.seed
        traj.info["attempt"] = task.attempt
        if traj.status == "error":
            self.failure_streak += 1
            self.last_error = str(traj.info.get("error"))
        else:
            self.failure_streak = 0
        return traj

    async def _deliver(self, traj: Trajectory) -> None:
        self.episodes_finished += 1
        if traj.status == "error":
            self.errors += 1
        result = self._on_trajectory(traj)
        if asyncio.iscoroutine(result):
            await result

    async def _worker(self, env: Env) -> None:
        while not self._stopping:
            if not self._admit():
                await asyncio.sleep(0.05)
                continue
            task = self._next_task()
            traj = await self._play(env, task)
            if traj.status == "error" and task.attempt < self._max_retries:
                logger.warning("retrying task %s after: %s", task.seed, traj.info.get("error"))
                self._requeued.appendleft(Task(task.seed, task.attempt + 1))
                self.errors += 1
                continue
            await self._deliver(traj)

    async def start(self) -> None:
        """Start the workers (asynchronous mode). They run until :meth:`stop`."""
        if self._workers:
            return
        self._stopping = False
        if not self._envs:
            self._envs = [self._env_factory() for _ in range(self._concurrency)]
        self._workers = [asyncio.create_task(self._worker(env)) for env in self._envs]

    async def stop(self) -> None:
        """Stop the workers; in-flight episodes are cancelled and their tasks requeued."""
        self._stopping = True
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []

    async def collect(self, n: int) -> list[Trajectory]:
        """Play exactly ``n`` episodes (``concurrency`` at a time) and return them (synchronous mode)."""
        if not self._envs:
            self._envs = [self._env_factory() for _ in range(self._concurrency)]
        tasks = [self._next_task() for _ in range(n)]
        free: asyncio.Queue[Env] = asyncio.Queue()
        for env in self._envs:
            free.put_nowait(env)

        async def one(task: Task) -> Trajectory:
            env = await free.get()
            try:
                traj = await self._play(env, task)
                while traj.status == "error" and task.attempt < self._max_retries:
                    self.errors += 1
                    task = Task(task.seed, task.attempt + 1)
                    traj = await self._play(env, task)
                return traj
            finally:
                free.put_nowait(env)

        trajs = await asyncio.gather(*(one(t) for t in tasks))
        for traj in trajs:
            self.episodes_finished += 1
            if traj.status == "error":
                self.errors += 1
        return list(trajs)

    async def close(self) -> None:
        """Stop the workers and close every environment."""
        await self.stop()
        for env in self._envs:
            await env.close()
        self._envs = []
