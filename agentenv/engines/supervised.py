"""An engine that is rebuilt from the latest weights when it dies.

:class:`SupervisedEngine` wraps a :class:`~agentenv.engines.base.GenerationEngine`. When a request
fails with :class:`~agentenv.errors.EngineDied` (the engine's decode thread or process died, or a
forward pass failed with requests in flight), the supervisor closes the dead engine, asks ``rebuild``
for a fresh one serving the learner's latest weights and version, and answers every request that was
in flight on the dead engine with :class:`~agentenv.errors.EngineRebuilt`: the rollout records the
episode as failed with ``info["requeue"]`` and the collector plays its task again from the start
(its partial tokens are dropped: the dead engine's KV cache is gone, so continuing them exactly is
not possible). Requests arriving during the rebuild wait for it. Each rebuild is counted in
:data:`agentenv.faults.FAULTS` (``engine_rebuilds``) with its time to recovery: from the first failed
request to the new engine serving.

An engine that keeps dying is not rebuilt for ever: after ``max_rebuilds`` rebuilds within
``window_s`` seconds the supervisor gives up and requests fail with a plain
:class:`~agentenv.errors.EngineError` (the collector's failure rule then stops the run).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from agentenv.engines.base import GenerationEngine, GenerationOutput, SamplingParams
from agentenv.errors import ClosedError, EngineDied, EngineError, EngineRebuilt
from agentenv.faults import FAULTS, FaultLog

logger = logging.getLogger(__name__)

_CLOSE_TIMEOUT_S = 30.0  # seconds allowed for closing a dead engine


class SupervisedEngine:
    """Serve through ``engine``; rebuild it with ``rebuild(dead_engine)`` when it dies.

    Implements :class:`agentenv.engines.base.GenerationEngine`; other attributes go to the current
    engine.

    Args:
        engine: The engine to serve through first.
        rebuild: ``async (dead) -> engine``: a fresh engine serving the learner's latest weights and
            version (it may reuse the dead engine's model module, reloading every weight).
        max_rebuilds: Rebuilds allowed within ``window_s`` before the supervisor gives up.
        window_s: Seconds over which ``max_rebuilds`` is counted.
        faults: Where rebuilds are recorded (default the process-wide :data:`~agentenv.faults.FAULTS`).

    Attributes:
        rebuilds: Rebuilds so far.
        requeued: Requests answered with :class:`EngineRebuilt` so far.
    """

    def __init__(self, engine: GenerationEngine, rebuild: Callable[[Any], Awaitable[GenerationEngine]], *,
                 max_rebuilds: int = 5, window_s: float = 600.0, faults: FaultLog | None = None) -> None:
        self.engine = engine
        self._rebuild = rebuild
        self._max_rebuilds = max_rebuilds
        self._window_s = window_s
        self._faults = faults or FAULTS
        self._lock = asyncio.Lock()
        self._times: collections.deque[float] = collections.deque()
        self._gave_up: EngineError | None = None
        self.rebuilds = 0
        self.requeued = 0

    @property
    def version(self) -> int:
        """The serving engine's policy version."""
        return self.engine.version

    @property
    def max_context_tokens(self) -> int:
        """The serving engine's context limit (tokens)."""
        return self.engine.max_context_tokens

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """``engine.generate``; a death rebuilds the engine (see the module docstring).

        Raises:
            EngineRebuilt: The engine died during this request and was rebuilt (requeue the episode).
            EngineError: What the engine raises for the request itself, or the supervisor gave up.
        """
        if self._lock.locked():  # a rebuild is under way: wait for the new engine
            async with self._lock:
                pass
        if self._gave_up is not None:
            raise self._gave_up
        engine = self.engine
        try:
            return await engine.generate(prompt_ids, params)
        except EngineDied as exc:
            await self._recover(engine, exc, time.monotonic())
            self.requeued += 1
            raise EngineRebuilt(f"the engine died ({exc}) and was rebuilt; the episode is played again") from exc
        except (EngineError, ClosedError) as exc:
            if self.engine is engine and not self._lock.locked():
                raise  # the request's own error (an over-long prompt, ...)
            async with self._lock:  # the dead engine was closed under this request by the rebuild
                pass
            self.requeued += 1
            raise EngineRebuilt(f"the engine was rebuilt during this request ({exc}); the episode is played "
                                "again") from exc

    async def update_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """``engine.update_weights``; skipped when a rebuild already serves ``version`` or newer.

        An update that meets a dying engine goes to its replacement (which, rebuilt from the learner's
        latest weights, usually serves ``version`` already).

        Raises:
            WeightUpdateError: As the engine's (the previous version keeps serving).
            EngineError: The supervisor gave up on the engine.
        """
        for _ in range(self._max_rebuilds + 2):
            async with self._lock:
                engine = self.engine
            if self._gave_up is not None:
                raise self._gave_up
            if self.rebuilds and version <= engine.version:
                return  # the rebuilt engine loaded these weights (or newer) already
            try:
                await engine.update_weights(weights, version)
                return
            except EngineDied as exc:
                await self._recover(engine, exc, time.monotonic())
            except (EngineError, ClosedError):
                if self.engine is engine and not self._lock.locked():
                    raise  # the update's own error (bad weights, an old version)
                async with self._lock:  # the dead engine was closed under the update by a rebuild
                    pass
        raise EngineError(f"the weights of version {version} did not reach an engine that kept dying")

    async def _recover(self, dead: Any, exc: BaseException, t_fault: float) -> None:
        """Replace ``dead`` (once, however many requests saw it die).

        Raises:
            EngineError: Too many rebuilds, or the rebuild itself failed (the supervisor gives up).
        """
        async with self._lock:
            if self.engine is not dead:  # another request's failure rebuilt it already
                return
            if self._gave_up is not None:
                raise self._gave_up
            now = time.monotonic()
            while self._times and now - self._times[0] > self._window_s:
                self._times.popleft()
            if len(self._times) >= self._max_rebuilds:
                self._gave_up = EngineError(f"the engine died {len(self._times) + 1} times within "
                                            f"{self._window_s:g} s; the latest: {exc}")
                logger.error("engine supervisor gives up: %s", self._gave_up)
                raise self._gave_up
            logger.warning("the engine died (%s); rebuilding it from the latest weights", exc)
            try:
                await asyncio.wait_for(dead.close(), _CLOSE_TIMEOUT_S)
            except Exception as close_exc:  # a dead engine may not close cleanly
                logger.warning("closing the dead engine raised %s: %s", type(close_exc).__name__, close_exc)
            try:
                self.engine = await self._rebuild(dead)
            except Exception as build_exc:
                self._gave_up = EngineError(f"rebuilding the engine failed: {build_exc!r} (it died with: {exc})")
                raise self._gave_up from build_exc
            self._times.append(time.monotonic())
            self.rebuilds += 1
            recovery = time.monotonic() - t_fault
            self._faults.record("engine_rebuilds", recovery, version=self.engine.version)
            logger.warning("engine rebuilt at version %d in %.2f s", self.engine.version, recovery)

    async def close(self) -> None:
        """Close the serving engine. Safe to call twice."""
        await self.engine.close()

    def __getattr__(self, name: str) -> Any:
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)


async def rebuild_from_learner(dead: Any, learner: Any, build: Callable[[torch.nn.Module], GenerationEngine]
                               ) -> GenerationEngine:
    """A fresh engine serving ``learner``'s current weights and version (a ``rebuild`` for :class:`SupervisedEngine`).

    Call it while the learner does not step (the recipe holds its learner lock), so that the weights and
    the version agree. The dead engine's model module is reused when it has one (the transformers
    engine), with every weight reloaded from the learner; otherwise (vLLM) a copy of the learner's
    model is built from. A dead engine that decoded the learner's parameters in place
    (:meth:`~agentenv.engines.transformers_engine.TransformersEngine.serve_in_place`) is replaced by one
    that does too, on the same lock: nothing is copied, and the version is the learner's.

    Args:
        dead: The engine that died.
        learner: Has ``weights_for_engine()``, ``version`` and ``model``.
        build: ``model -> engine`` at version 0 (``trainer.setup.build_engine``); run in a worker thread.

    Raises:
        EngineError: ``build`` failed to start an engine.
        WeightUpdateError: The learner's weights did not load.
    """
    import copy

    from agentenv.engines.transformers_engine import TransformersEngine
    from agentenv.engines.weights import copy_into

    if isinstance(dead, TransformersEngine) and dead.shared_weights is not None:
        engine = await asyncio.to_thread(build, dead.model)
        if not isinstance(engine, TransformersEngine):
            raise EngineError(f"an engine decoding in place was rebuilt as a {type(engine).__name__}")
        engine.serve_in_place(learner.model, dead.shared_weights)
        return engine
    weights = await asyncio.to_thread(learner.weights_for_engine)
    version = learner.version
    # the dead engine's own module is reused when it has one; otherwise a copy of the learner's
    model = dead.model if isinstance(dead, TransformersEngine) else copy.deepcopy(learner.model)
    await asyncio.to_thread(copy_into, model, weights)
    engine = await asyncio.to_thread(build, model)
    if version > engine.version:
        await engine.update_weights(weights, version)
    return engine
