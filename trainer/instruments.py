"""What experiments measure and force around the training loop; the algorithm needs none of it.

:class:`Instruments` gathers them, so that :mod:`agentenv.trainer.train` reads as the algorithm
(rollout, select, update, sync, log) with one call per hook:

- **busy clocks** (:class:`agentenv.trainer.overlap.LoopBusy`): the seconds the engine, the
  environments and the learner were busy since the update loop began (``busy/*`` in every metrics
  row; the summary's ``overlap/*``);
- **a forced policy lag** (``staleness.forced_lag = k``, :mod:`agentenv.rollout.forced_lag`): the engine
  serves the learner's weights k versions late;
- **a wall-clock budget** (``loop_seconds``: ``agentenv study``'s equal wall-clock time): when it
  is spent the loop ends after the update at hand;
- **the entropy probe** (``run.entropy_probe`` rows of the first batch): the policy's entropy on the
  same states after every update (``probe/policy_entropy``);
- **fault counters** (:data:`agentenv.faults.FAULTS`): engine rebuilds, replaced sandboxes and
  environments, grader kills, in every metrics row.

Pause points (:mod:`agentenv.trainer.pause`) stay where they are: a single call at each moment a
test kills a run.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentenv.engines.busy import BusyClock
from agentenv.faults import FAULTS
from agentenv.rollout.forced_lag import LaggedWeights, Snapshot
from agentenv.rollout.pool import BatchSelection
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trainer.overlap import LoopBusy
from agentenv.trajectory import Trajectory

__all__ = ["Instruments"]


class Instruments:
    """The busy clocks, the forced lag, the wall-clock budget and the entropy probe of one run.

    Args:
        cfg: The run's config (``staleness.forced_lag``, ``run.entropy_probe``).
        engine_clock: The engine's busy clock (``BusyTrackingEngine.clock``).
        halt: Set when the budget is spent (it ends the update loop).
        loop_seconds: The update loop's budget in seconds from :meth:`start_loop` (None: none;
            <= 0: spent before the first batch).
    """

    def __init__(self, cfg: TrainConfig, engine_clock: BusyClock, halt: asyncio.Event,
                 loop_seconds: float | None) -> None:
        self.busy = LoopBusy(engine_clock)
        self.spent = asyncio.Event()
        """Set when ``loop_seconds`` passed (the summary's ``budget_spent``)."""
        self.lag: LaggedWeights[Any] | None = None
        self._forced_lag = cfg.staleness.forced_lag
        self._probe_rows = cfg.run.entropy_probe
        self._probe: list[Trajectory] = []
        self._probe_entropy: float | None = None
        self._halt = halt
        self._loop_seconds = loop_seconds
        self._timer: asyncio.TimerHandle | None = None

    # -- the forced lag ------------------------------------------------------------------------------
    async def start_lag(self, learner: PolicyLearner) -> None:
        """The engine serves the learner's weights: a forced lag counts from here (after a resume, again).

        Without ``staleness.forced_lag`` nothing is copied.
        """
        if self._forced_lag:
            weights = await asyncio.to_thread(learner.weights_for_engine)
            self.lag = LaggedWeights(self._forced_lag, learner.version, weights)

    def engine_source(self, learner: PolicyLearner) -> Any:
        """What a rebuilt engine loads: the learner, or under a forced lag the lagged weights it should serve."""
        return self.lag.engine_source(learner) if self.lag is not None else learner

    def due(self, version: int, weights: Any) -> Snapshot[Any] | None:
        """The learner stepped to ``version``: the snapshot the engine loads now (None: it keeps its weights)."""
        return Snapshot(version, weights) if self.lag is None else self.lag.push(version, weights)

    # -- the update loop's clock and budget ----------------------------------------------------------
    def start_loop(self) -> None:
        """The update loop begins: the busy clocks start from zero and the budget's timer runs."""
        if self._loop_seconds is not None and self._loop_seconds <= 0:  # nothing left (a resumed budget)
            self._spend()
        elif self._loop_seconds is not None:
            self._timer = asyncio.get_running_loop().call_later(self._loop_seconds, self._spend)
        self.busy.start()

    def _spend(self) -> None:
        self.spent.set()
        self._halt.set()

    def end_loop(self) -> dict[str, float]:
        """The update loop is over: its busy figures (the budget's timer stops: closing is not spent on it)."""
        if self._timer is not None:
            self._timer.cancel()
        return self.busy.figures()

    # -- the entropy probe ---------------------------------------------------------------------------
    async def after_step(self, learner: PolicyLearner, selection: BatchSelection) -> None:
        """After an update that stepped: the policy's entropy on the probe's fixed states (the first batch's rows)."""
        if self._probe_rows:
            self._probe = self._probe or list(selection.batch[: self._probe_rows])
            self._probe_entropy = await asyncio.to_thread(learner.entropy, self._probe)

    # -- the metrics row -----------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        """This update's row keys: ``probe/policy_entropy``, ``busy/*``, ``engine/busy_share``, ``faults/*``.

        ``busy/*`` are seconds since the loop began; ``probe/policy_entropy`` (nats per token) appears once measured.
        """
        row: dict[str, Any] = {}
        if self._probe_entropy is not None:
            row["probe/policy_entropy"] = self._probe_entropy
        row.update(self.busy.figures())
        row["engine/busy_share"] = row["busy/engine_s"] / max(row["busy/wall_s"], 1e-9)
        row.update(FAULTS.report())
        return row
