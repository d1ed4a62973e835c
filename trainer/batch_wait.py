"""The learner's wait for its next batch: the staleness policy's selection, PACE's scoring passes, the failure rule."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import torch

from agentenv.engines.busy import BusyClock
from agentenv.errors import AgentEnvError
from agentenv.rollout.collector import RolloutCollector
from agentenv.rollout.pool import BatchSelection, TrajectoryPool
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trajectory import Trajectory

__all__ = ["OffLoopScores", "failure_limit", "next_batch"]


def failure_limit(concurrency: int) -> int:
    """Failures in a row after which training stops with an error: ``max(16, 4 * concurrency)``.

    Counted by the collector in completion order: failed episodes (retries included), errors handing
    a trajectory to the pool, and crashed workers; a good episode resets the count. A broken
    environment, sandbox or engine reaches it within a few hundred episodes; intermittent failures
    (say 30%) practically never do (the rule and its numbers: :mod:`agentenv.rollout.collector`).
    """
    return max(16, 4 * concurrency)


async def next_batch(pool: TrajectoryPool, learner: PolicyLearner, cfg: TrainConfig, stop: asyncio.Event,
                     on_decision: Callable[[BatchSelection], None], collector: RolloutCollector,
                     learner_clock: BusyClock | None = None) -> BatchSelection | None:
    """Wait until the pool yields a full batch of B under the staleness policy (None when stopped).

    PACE's scoring passes (``staleness.drift_mode=scoring``) run on ``learner_clock`` when given.

    Every selection attempt is a logged decision: ``on_decision(selection)`` sees each one, also
    the attempts that rejected trajectories but left too few for a batch. Failed episodes never
    reach the pool (the collector replays or drops their tasks), so the wait ends either with a
    batch or with the failure rule below; the collector's workers survive any episode's error.

    Raises:
        AgentEnvError: :func:`failure_limit` failures in a row (``collector.failure_streak``; a
            broken environment, sandbox or engine); the message carries the last error. Checked
            every 50 ms, so an asynchronous run stops within that of the collector's limit.
    """
    scoring = cfg.staleness.policy == "pace" and cfg.staleness.drift_mode == "scoring"
    scores = OffLoopScores(learner, learner_clock) if scoring else None
    watch = collector.no_update_watch()  # warns when the wait passes collector.no_update_warning_s
    while not stop.is_set():
        if collector.failure_streak >= failure_limit(cfg.run.concurrency):
            raise AgentEnvError(f"the last {collector.failure_streak} episodes all failed; "
                                f"the latest with: {collector.last_error}")
        if len(pool) >= cfg.run.batch_size:
            if scores is not None:  # the forward passes run in a worker thread, episodes go on
                await scores.prepare(pool.trajectories)
            scorer = scores.lookup if scores is not None else None
            selection = pool.select_batch(cfg.run.batch_size, learner.version, drift_scorer=scorer)
            on_decision(selection)
            if selection.batch:
                return selection
        watch.check(f"{len(pool)} of {cfg.run.batch_size} trajectories in the pool")
        await asyncio.sleep(0.05)
    return None


class OffLoopScores:
    """PACE's scoring passes (current log pi of pooled trajectories) computed off the event loop.

    ``TrajectoryPool.select_batch`` calls its drift scorer synchronously; a forward pass there would
    stall every episode of the collector for its length. :meth:`prepare` scores the pooled
    trajectories not yet scored in a worker thread (the pool is only read, on the loop, for the
    list); :meth:`lookup`, the scorer handed to the pool, then answers from that cache and scores on
    the loop only what arrived after ``prepare`` (a trajectory or two). One instance serves one call
    of :func:`next_batch`, during which the learner's version does not move, so the scores stay valid.

    Args:
        learner: Scores with ``learner.score``.
        clock: The learner's busy clock, run while it scores (a fresh one by default).
    """

    def __init__(self, learner: PolicyLearner, clock: BusyClock | None = None) -> None:
        self.learner = learner
        self.clock = clock or BusyClock()
        self.cache: dict[str, torch.Tensor] = {}

    async def prepare(self, trajectories: Sequence[Trajectory]) -> None:
        """Score, in a worker thread, those of ``trajectories`` not cached yet."""
        todo = [t for t in trajectories if t.id not in self.cache]
        if todo:
            with self.clock.running():
                out = await asyncio.to_thread(self.learner.score, todo)
            self.cache.update(zip((t.id for t in todo), out, strict=True))

    def lookup(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """The drift scorer for ``select_batch``: cached scores, missing ones computed here."""
        missing = [t for t in trajectories if t.id not in self.cache]
        if missing:
            with self.clock.running():
                out = self.learner.score(missing)
            self.cache.update(zip((t.id for t in missing), out, strict=True))
        return [self.cache[t.id] for t in trajectories]
