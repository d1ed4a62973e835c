"""A long-tailed delay on every environment step, for any environment (``env.step_latency``).

Real tools answer in a long-tailed time (a compiler, a web call, a test suite): most calls are
quick, a few take many times the median. :class:`StepLatency` wraps an environment and waits a
lognormal delay before each ``step``::

    delay = median_s * exp(sigma * z),   z ~ N(0, 1)

so the median delay is ``median_s`` seconds, the mean ``median_s * exp(sigma^2 / 2)``, and the 99th
percentile ``median_s * exp(2.326 sigma)`` (sigma = 1: 10.2x the median). The delay is an
``await asyncio.sleep``: other episodes, the engine and the learner go on meanwhile. ``z`` comes
from the wrapper's own generator, seeded at each ``reset(seed=s)`` from ``s`` (salted, so it is
independent of the environment's own ``np_random``): an episode replayed with its seed waits the
same delays. Observations, rewards, flags and infos pass through unchanged.

The trainer applies it to the training environments when ``env.step_latency.median_s > 0``
(:func:`agentenv.trainer.setup.env_factory`); the held-out evaluation runs without it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentenv.errors import ConfigError

__all__ = ["StepLatency", "StepLatencyConfig"]

#: Mixed into the episode seed, so the delays do not repeat the environment's own random draws.
_SALT = 0x5_7E9_1A7


@dataclass(frozen=True)
class StepLatencyConfig:
    """A lognormal delay before every environment step (:class:`StepLatency`); off by default."""

    median_s: float = 0.0
    """Median delay per step (seconds, >= 0); 0 turns the delay off."""
    sigma: float = 0.0
    """Lognormal shape: standard deviation of ``log(delay)`` (>= 0; 0 waits exactly ``median_s``,
    1 gives a 99th percentile of about 10x the median)."""

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ConfigError: A field is not a finite number >= 0 (the message names it).
        """
        for name in ("median_s", "sigma"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"env.step_latency.{name} must be a finite number >= 0, got {v!r}")

    @property
    def enabled(self) -> bool:
        """Whether steps are delayed at all (``median_s > 0``)."""
        return self.median_s > 0


class StepLatency:
    """An environment whose every ``step`` first waits a seeded lognormal delay (see the module docstring).

    Every attribute other than ``reset``, ``step`` and ``close`` is the wrapped environment's
    (``tools``, ``observation_role``, ``tasks()``, ...).

    Args:
        env: The environment to wrap (an :class:`agentenv.core.Env`).
        config: Median and shape of the delay.
        sleep: The coroutine that waits (seconds); ``asyncio.sleep``, replaceable in tests.

    Attributes:
        delays: The delays of this episode's steps so far (seconds), in order; cleared by ``reset``.
    """

    def __init__(self, env: Any, config: StepLatencyConfig,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.env = env
        self.config = config
        self._sleep = sleep
        self._rng = np.random.default_rng()
        self.delays: list[float] = []

    def next_delay(self) -> float:
        """Draw the next step's delay (seconds) from the episode's generator."""
        z = float(self._rng.standard_normal())
        return self.config.median_s * math.exp(self.config.sigma * z)

    async def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> Any:
        """``env.reset``, unchanged; ``seed`` (when given) also seeds the delays of the episode."""
        if seed is not None:
            self._rng = np.random.default_rng([seed, _SALT])
        self.delays = []
        return await self.env.reset(seed=seed, options=options)

    async def step(self, action: Any) -> Any:
        """Wait the next delay (without blocking the event loop), then ``env.step(action)``, unchanged."""
        delay = self.next_delay()
        self.delays.append(delay)
        await self._sleep(delay)
        return await self.env.step(action)

    async def close(self) -> None:
        """``env.close``."""
        await self.env.close()

    async def __aenter__(self) -> StepLatency:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet (copy, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.env, name)

    def __repr__(self) -> str:
        return f"<StepLatency(median_s={self.config.median_s}, sigma={self.config.sigma}) {self.env!r}>"
