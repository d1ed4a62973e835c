"""Forced policy lag (``staleness.forced_lag = k``): the generation engine serves the learner's weights k versions late.

After the learner's update to policy version ``v`` the engine holds version ``e(v) = max(v0, v - k)``
(``v0``: the version the run started or resumed at), so every token sampled while the learner is at
``v'`` comes from a version ``v_t <= max(v0, v' - k)``. A trajectory the learner consumes at version
``v`` therefore has every token lag ``v - v_t >= min(k, v - v0)`` and token-averaged staleness
``S = GS + WS >= min(k, v - v0)`` (policy versions; :mod:`agentenv.rollout.staleness`): after the first ``k``
updates every batch is at least ``k`` versions off-policy, the setting of the FlashREINFORCE paper's
"stable at policy lag ~ 4" claim (``agentenv study gate_under_lag``). The generator keeps producing
all the while, under the lagged weights; segments record the lagged version truthfully.

Why the engine lags and not the pool: a pool that only held trajectories back (consuming at ``v``
only those of version ``<= v - k``) while the engine followed the learner would deadlock as soon as
fewer than B trajectories complete per version, which is the normal case once a backlog exists (the
learner then steps without waiting): the backlog drains, and at some ``v`` the learner waits for
trajectories of version ``<= v - k`` that the engine, already at ``v``, can no longer generate.

The snapshots are the learner's CPU copies of its weights (``weights_for_engine()``): up to
``k + 1`` of them are held (the engine's own and the ``k`` newer ones), so host memory grows by
``k + 1`` copies of the weights. They are not checkpointed: after ``--resume`` the lag builds up
again over ``k`` updates (``v0`` is the resumed version).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Generic, NamedTuple, TypeVar

from agentenv.errors import ConfigError, DataError

__all__ = ["LaggedWeights", "Snapshot"]

W = TypeVar("W")


class Snapshot(NamedTuple, Generic[W]):
    """The learner's weights at one policy version."""

    version: int
    weights: W


class LaggedWeights(Generic[W]):
    """The weight snapshots between the engine's version and the learner's, released ``lag`` versions late.

    Args:
        lag: ``k``, policy versions the engine stays behind the learner (>= 0; 0 releases every
            snapshot at once).
        version: The version the engine serves now (the run's start or resume version).
        weights: Those weights (kept so that a rebuilt engine can serve them again).

    Raises:
        ConfigError: ``lag`` is not an int >= 0.
    """

    def __init__(self, lag: int, version: int, weights: W) -> None:
        if isinstance(lag, bool) or not isinstance(lag, int) or lag < 0:
            raise ConfigError(f"staleness.forced_lag must be an int >= 0 (policy versions), got {lag!r}")
        self.lag = lag
        self._held: deque[Snapshot[W]] = deque([Snapshot(version, weights)])

    @property
    def engine(self) -> Snapshot[W]:
        """The snapshot the engine serves (or must serve, after a rebuild)."""
        return self._held[0]

    @property
    def held_versions(self) -> list[int]:
        """Versions held, the engine's first (at most ``lag + 1`` of them)."""
        return [s.version for s in self._held]

    def push(self, version: int, weights: W) -> Snapshot[W] | None:
        """The learner stepped to ``version`` with ``weights``: the snapshot the engine must load now, or None.

        Returns the newest held snapshot of a version ``<= version - lag`` when it is newer than the
        engine's (the older ones are dropped); None when the engine keeps what it serves.

        Raises:
            DataError: ``version`` is not above the newest version pushed so far.
        """
        if version <= self._held[-1].version:
            raise DataError(f"forced lag: version {version} after version {self._held[-1].version}; "
                            "versions must increase")
        self._held.append(Snapshot(version, weights))
        due = None
        while len(self._held) > 1 and self._held[1].version <= version - self.lag:
            self._held.popleft()
            due = self._held[0]
        return due

    def engine_source(self, learner: Any) -> Any:
        """A stand-in for ``learner`` in :func:`agentenv.engines.supervised.rebuild_from_learner`.

        It has the engine's lagged weights and version, and ``learner.model`` (to build a model from).
        """
        return _Source(self, learner.model)


class _Source:
    def __init__(self, lag: LaggedWeights[Any], model: Any) -> None:
        self._lag, self.model = lag, model

    @property
    def version(self) -> int:
        return self._lag.engine.version

    def weights_for_engine(self) -> Any:
        return self._lag.engine.weights
