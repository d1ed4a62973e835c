"""How much of the wall-clock time a generation engine is busy: the utilisation figure of async vs sync.

An engine counts as busy while at least one ``generate`` request is in flight (prefill, decoding, or
waiting for its next token in the engine's batch). Synchronous RL leaves the engine idle while the
learner trains; asynchronous RL keeps it busy; the ratio of busy time to wall-clock time shows it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from agentenv.engines.base import GenerationEngine, GenerationOutput, SamplingParams


class BusyClock:
    """Accumulates the wall-clock seconds during which one or more requests are in flight.

    Overlapping requests count once: the clock runs from the moment the first of them starts until
    the last of them ends. Not thread-safe: use it from one event loop.

    Args:
        clock: Monotonic time source (seconds); injectable for tests.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._in_flight = 0
        self._since = 0.0
        self._busy = 0.0

    def start(self) -> None:
        """A request begins."""
        if self._in_flight == 0:
            self._since = self._clock()
        self._in_flight += 1

    def stop(self) -> None:
        """A request ends (successfully or not).

        Raises:
            RuntimeError: More stops than starts.
        """
        if self._in_flight == 0:
            raise RuntimeError("BusyClock.stop() without a matching start()")
        self._in_flight -= 1
        if self._in_flight == 0:
            self._busy += self._clock() - self._since

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """A request for the length of the ``with`` block (also when it raises or is cancelled)."""
        self.start()
        try:
            yield
        finally:
            self.stop()

    @property
    def busy_seconds(self) -> float:
        """Busy time so far (seconds), including the running stretch if requests are in flight."""
        running = self._clock() - self._since if self._in_flight else 0.0
        return self._busy + running


class BusyTrackingEngine:
    """A :class:`~agentenv.engines.base.GenerationEngine` that times its own busy share.

    Every call and attribute goes to the wrapped engine; ``generate`` is also timed on :attr:`clock`.

    Args:
        engine: The engine to wrap.
        clock: The busy clock (a new one by default).
    """

    def __init__(self, engine: GenerationEngine, clock: BusyClock | None = None) -> None:
        self.engine = engine
        self.clock = clock or BusyClock()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """``engine.generate``, timed; raises what the engine raises."""
        self.clock.start()
        try:
            return await self.engine.generate(prompt_ids, params)
        finally:
            self.clock.stop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)
