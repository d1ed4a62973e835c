"""How much the training loop's three parts overlap: busy seconds of engine, environments, learner.

Each part has a :class:`~agentenv.engines.busy.BusyClock` (seconds with at least one call in flight;
overlapping calls count once):

- the engine (``T_gen``): ``generate`` requests in flight (:class:`~agentenv.engines.busy.BusyTrackingEngine`);
- the environments (``T_env``): ``reset``/``step``/``close`` calls of any training environment in
  flight (:class:`BusyTrackingEnv`, wrapped around each environment the collector builds);
- the learner (``T_train``): from the start of ``learner.update`` until the engine holds the new
  weights (the step, the release of its freed memory, the state-dict copy and the engine's weight
  update), plus PACE's scoring passes (``staleness.drift_mode=scoring``). Checkpoint writes are not
  counted.

:class:`LoopBusy` reads the three clocks and the wall clock from the start of the update loop;
:func:`overlap` turns the totals into the overlap bound and the overlap the run achieved.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agentenv.engines.busy import BusyClock

__all__ = ["BusyTrackingEnv", "LoopBusy", "overlap", "timed_env_factory"]


class BusyTrackingEnv:
    """An environment whose ``reset``, ``step`` and ``close`` calls run on a busy clock.

    Every other attribute goes to the wrapped environment. One clock is shared by all the
    environments of a run, so their calls in flight at the same time count once.

    Args:
        env: The environment to wrap (an :class:`agentenv.core.Env`).
        clock: The shared busy clock.
    """

    def __init__(self, env: Any, clock: BusyClock) -> None:
        self.env = env
        self.clock = clock

    async def reset(self, *args: Any, **kwargs: Any) -> Any:
        """``env.reset``, timed; raises what it raises."""
        with self.clock.running():
            return await self.env.reset(*args, **kwargs)

    async def step(self, action: Any) -> Any:
        """``env.step``, timed; raises what it raises."""
        with self.clock.running():
            return await self.env.step(action)

    async def close(self) -> None:
        """``env.close``, timed; raises what it raises."""
        with self.clock.running():
            await self.env.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


def timed_env_factory(factory: Callable[[], Any], clock: BusyClock) -> Callable[[], BusyTrackingEnv]:
    """``factory`` whose environments are :class:`BusyTrackingEnv` on ``clock``."""
    return lambda: BusyTrackingEnv(factory(), clock)


class LoopBusy:
    """Cumulative busy seconds of the engine, the environments and the learner since :meth:`start`.

    Args:
        engine_clock: The engine's clock (``BusyTrackingEngine.clock``); it may have run before
            :meth:`start` (a held-out evaluation): only what follows counts.
        clock: Monotonic time source (seconds) of the wall clock and the two new busy clocks; must be
            the engine clock's source too. Injectable for tests.
    """

    def __init__(self, engine_clock: BusyClock, clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine_clock
        self.env = BusyClock(clock)
        """The environments' clock (hand it to :func:`timed_env_factory`)."""
        self.learner = BusyClock(clock)
        """The learner's clock (run the update under ``learner.running()``)."""
        self._clock = clock
        self._t0: float | None = None
        self._base = (0.0, 0.0, 0.0)

    def start(self) -> None:
        """The update loop begins: the wall clock and the three busy figures start from zero here."""
        self._t0 = self._clock()  # read first, so that no busy figure can exceed the wall clock
        self._base = (self.engine.busy_seconds, self.env.busy_seconds, self.learner.busy_seconds)

    def figures(self) -> dict[str, float]:
        """``busy/engine_s``, ``busy/env_s``, ``busy/learner_s`` and ``busy/wall_s``: seconds since :meth:`start`.

        Raises:
            RuntimeError: :meth:`start` was not called.
        """
        if self._t0 is None:
            raise RuntimeError("LoopBusy.figures() before start()")
        now = (self.engine.busy_seconds, self.env.busy_seconds, self.learner.busy_seconds)
        engine_s, env_s, learner_s = (b - a for a, b in zip(self._base, now, strict=True))
        return {"busy/engine_s": engine_s, "busy/env_s": env_s, "busy/learner_s": learner_s,
                "busy/wall_s": self._clock() - self._t0}


def overlap(gen_s: float, env_s: float, train_s: float, wall_s: float) -> dict[str, float]:
    """The overlap figures of a run's summary from its busy totals and wall-clock (all in seconds).

    With ``S = gen_s + env_s + train_s``:

    - ``overlap/bound`` = ``S / max(gen_s, env_s, train_s)``: the speed-up over running the three
      parts one after the other that perfect overlap would give (1.0 to 3.0; 1.0 when all are zero);
    - ``overlap/achieved`` = ``S / wall_s``: the overlap the run realised (1.0 for parts that ran one
      after the other, the bound for perfect overlap; 0.0 when nothing was busy or ``wall_s`` is 0);
    - ``overlap/of_bound`` = achieved / bound = ``max(...) / wall_s``: the share of the bound realised
      (the issue's target is >= 0.9);
    - ``overlap/engine_s``, ``overlap/env_s``, ``overlap/learner_s``, ``overlap/wall_s``: the inputs.

    Raises:
        ValueError: A negative figure, or a busy total longer than ``wall_s`` (beyond a rounding
            tolerance of 1e-6 s): busy time is measured within the wall-clock time.
    """
    parts = (gen_s, env_s, train_s)
    if min(*parts, wall_s) < 0:
        raise ValueError(f"busy and wall-clock seconds must be >= 0, got {parts} and {wall_s}")
    if max(parts) > wall_s + 1e-6:
        raise ValueError(f"a busy total {max(parts)} s exceeds the wall-clock {wall_s} s")
    total, top = sum(parts), max(parts)
    bound = total / top if top > 0 else 1.0
    achieved = total / wall_s if wall_s > 0 else 0.0
    return {"overlap/bound": bound, "overlap/achieved": achieved, "overlap/of_bound": achieved / bound,
            "overlap/engine_s": gen_s, "overlap/env_s": env_s, "overlap/learner_s": train_s,
            "overlap/wall_s": wall_s}
