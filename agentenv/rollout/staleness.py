"""Staleness control maths: PACE's effective staleness and adaptive rejection budget.

Implements docs/algorithms.md, "Staleness" and "PACE" (our specification of PACE, Pool-Aware Control of
Effective Staleness, arXiv 2609.36830). All quantities are in *policy versions* (optimizer steps).
For candidate ``i`` in the pool, with consumption version ``v_now``:

* generation staleness ``GS_i = (1/T) sum_k n_k (v_c - v_k)``  (:meth:`Trajectory.generation_staleness`)
* waiting staleness    ``WS_i = v_now - v_c``
* prefix drift ``f_i`` = mean over the tokens of segments older than the newest segment of
  ``|log pi_now(a_t) - log mu(a_t)|`` (:func:`prefix_drift`); 0 for a trajectory whose policy tokens
  were all sampled under one version.
* percentile rank ``u_i`` of ``f_i`` among the candidates (:func:`percentile_rank`), weight
  ``w_i = u_i ** gamma`` and effective staleness ``S_eff_i = WS_i + w_i * GS_i``.
* excess ``e = max(0, (N_pool - N_target) / N_pool)``, smoothed rate ``r <- beta r + (1 - beta) e``,
  budget ``k = round(r N_pool)`` (round half up), capped so the pool is never cut below
  ``max(N_target, B)`` (:func:`rejection_budget`); the ``k`` candidates with the highest ``S_eff`` are
  rejected (:func:`highest_first`).

Everything here is a pure function of numpy arrays so the pool can keep per-trajectory summary
columns and decide in a few vectorised passes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from agentenv.errors import ConfigError, DataError

POLICIES = ("sync", "none", "max_lag", "pace")
DRIFT_MODES = ("scoring", "token_share")


@dataclass(frozen=True)
class StalenessConfig:
    """How the trajectory pool filters stale trajectories (docs/algorithms.md, "Staleness policies").

    A rejected trajectory's task is always played again (the loop requeues it), so that rejections
    never starve the tasks whose episodes run long.
    """

    MOVED_FIELDS: ClassVar[dict[str, str]] = {
        "requeue_rejected": "always on (a rejected trajectory's task is played again)",
        "max_lag_measure": "always the oldest token's lag (staleness.max_lag)",
    }

    policy: str = "pace"
    """``"pace"`` (adaptive budget on effective staleness), ``"max_lag"`` (fixed cap), ``"none"``
    (unfiltered asynchronous), or ``"sync"`` (the loop runs generation and training without overlap;
    the pool then selects like ``"none"``)."""
    max_lag: float = 4.0
    """``max_lag`` policy: reject candidates whose oldest token is more than this many policy versions
    old, ``v_now - min_t v_t > max_lag`` (an inclusive cap on every token, the usual per-sample cap of
    other frameworks; the token average ``S = GS + WS`` would admit single tokens older than the cap)."""
    gamma: float = 4.0
    """``pace``: exponent of the percentile-rank weight ``w_i = u_i ** gamma`` (> 0)."""
    beta: float = 0.9
    """``pace``: smoothing of the rejection rate ``r <- beta r + (1 - beta) e``, in [0, 1)."""
    target_occupancy: int | None = None
    """``pace``: the pool occupancy ``N_target`` (trajectories) above which the excess is rejected;
    ``None`` means the batch size B. Mean waiting staleness is about ``N_target / B`` versions."""
    drift_mode: str = "scoring"
    """``pace``: ``"scoring"`` weights GS by the percentile rank of the prefix drift from a scoring pass
    of the current learner (needs a ``drift_scorer``); ``"token_share"`` (the cheap mode, called
    ``pace_share`` in the simulator) weights GS by the token share of segments older than the newest."""
    forced_lag: int = 0
    """Forced policy lag ``k`` (policy versions; 0 = off): the generation engine serves the learner's
    weights ``k`` versions late (:mod:`agentenv.rollout.forced_lag`), so after the first ``k`` updates every
    consumed trajectory has ``S = GS + WS >= k`` (each token's lag is at least ``k``); the ablation
    setting of ``agentenv study gate_under_lag``. Holds ``k + 1`` copies of the weights in host
    memory. Pair it with policy ``none`` (or a ``max_lag`` cap of at least ``k``, or ``pace``) so that
    the lag is not rejected away."""

    def __post_init__(self) -> None:
        """Validate every field.

        Raises:
            ConfigError: A value is of the wrong type or out of range.
        """
        if self.policy not in POLICIES:
            raise ConfigError(f"staleness.policy must be one of {POLICIES}, got {self.policy!r}")
        if self.drift_mode not in DRIFT_MODES:
            raise ConfigError(f"staleness.drift_mode must be one of {DRIFT_MODES}, got {self.drift_mode!r}")
        for name in ("max_lag", "gamma", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"staleness.{name} must be a finite number, got {v!r}")
        if self.max_lag < 0:
            raise ConfigError(f"staleness.max_lag must be >= 0 versions, got {self.max_lag}")
        if self.gamma <= 0:
            raise ConfigError(f"staleness.gamma must be > 0, got {self.gamma}")
        if not 0.0 <= self.beta < 1.0:
            raise ConfigError(f"staleness.beta must be in [0, 1), got {self.beta}")
        t = self.target_occupancy
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ConfigError(f"staleness.target_occupancy must be None or an int >= 1, got {t!r}")
        k = self.forced_lag
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"staleness.forced_lag must be an int >= 0 (policy versions), got {k!r}")
        if self.policy == "max_lag" and k > self.max_lag:
            raise ConfigError(f"staleness.forced_lag={k} with staleness.policy=max_lag and max_lag={self.max_lag}: "
                              f"once the lag is reached every trajectory is over the cap and rejected; use "
                              f"max_lag >= {k} or policy none")


def percentile_rank(values: np.ndarray) -> np.ndarray:
    """Percentile rank ``u_i = R_i / n`` of each value among all ``n`` values.

    ``R_i`` is the 1-based *average* rank (ties share the mean of the ranks they span, like
    ``scipy.stats.rankdata(method="average")``), so ``u`` lies in ``(0, 1]``: the unique largest value
    gets 1, a single value gets 1, and ``n`` equal values all get ``(n + 1) / (2 n)``. Ties are exact
    float equality.

    Args:
        values: ``(n,)`` float array (e.g. prefix drifts ``f``).

    Returns:
        ``(n,)`` float64 array of ranks in ``(0, 1]``; empty for empty input.

    Raises:
        DataError: A value is NaN.
    """
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[0]
    if n == 0:
        return np.zeros(0)
    if np.isnan(v).any():
        raise DataError("percentile_rank: NaN among the values")
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    last = np.cumsum(counts)  # 1-based rank of each distinct value's last occurrence
    avg = last - (counts - 1) / 2.0
    return avg[inverse.reshape(-1)] / n


def pace_weights(drift: np.ndarray, gamma: float) -> np.ndarray:
    """``w_i = u_i ** gamma`` with ``u`` the :func:`percentile_rank` of the prefix drifts ``(n,)``."""
    return percentile_rank(drift) ** gamma


def effective_staleness(ws: np.ndarray, gs: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``S_eff = WS + w * GS``, all ``(n,)`` arrays in policy versions (``w`` dimensionless)."""
    return np.asarray(ws, dtype=np.float64) + np.asarray(w, dtype=np.float64) * np.asarray(gs, np.float64)


def excess(n_pool: int, n_target: int) -> float:
    """Relative excess occupancy ``e = max(0, (N_pool - N_target) / N_pool)``; 0 for an empty pool."""
    if n_pool <= 0:
        return 0.0
    return max(0.0, (n_pool - n_target) / n_pool)


def update_rate(rate: float, e: float, beta: float) -> float:
    """Exponential smoothing ``r <- beta r + (1 - beta) e`` of the rejection rate."""
    return beta * rate + (1.0 - beta) * e


def rejection_budget(rate: float, n_pool: int, floor: int) -> int:
    """Number of candidates to reject: ``round(rate * n_pool)``, never leaving fewer than ``floor``.

    Rounding is half up (``floor(x + 0.5)``, not Python's banker's rounding). The cap
    ``max(0, n_pool - floor)`` with ``floor = max(N_target, B)`` means nothing is rejected when the
    occupancy is at or below the target, and a batch can always be formed after rejection.
    """
    k = int(math.floor(rate * n_pool + 0.5))
    return max(0, min(k, n_pool - floor))


def highest_first(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest ``scores``, largest first.

    Ties are broken by position, later first: candidates are in completion order, so among equal
    effective staleness the more recently completed one is rejected and the older one stays next in
    line for the batch.

    Args:
        scores: ``(n,)`` float array (e.g. ``S_eff``).
        k: How many to take (clipped to ``[0, n]``).

    Returns:
        ``(min(k, n),)`` int64 indices into ``scores``.
    """
    s = np.asarray(scores, dtype=np.float64)
    k = max(0, min(int(k), s.shape[0]))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    if k < s.shape[0]:  # only values >= the k-th largest can be taken (ties at the edge included)
        kth = np.partition(s, s.shape[0] - k)[s.shape[0] - k]
        cand = np.flatnonzero(s >= kth)
    else:
        cand = np.arange(s.shape[0])
    order = np.lexsort((-cand, -s[cand]))  # primary: score descending; secondary: position descending
    return cand[order[:k]].astype(np.int64)


def prefix_drift(current_logprobs: np.ndarray, behaviour_logprobs: np.ndarray, older: np.ndarray) -> float:
    """Prefix drift ``f = mean_{t in older} |log pi_now(a_t) - log mu(a_t)|`` (nats).

    Args:
        current_logprobs: ``(T,)`` log-probabilities of the policy tokens under the current learner.
        behaviour_logprobs: ``(T,)`` the sampler's stored log-probabilities of the same tokens.
        older: ``(T,)`` bool, True for tokens of segments older than the newest segment.

    Returns:
        ``f`` in nats; 0.0 when no token is older (a single-version trajectory).

    Raises:
        DataError: Shapes differ, or a selected log-probability is not finite.
    """
    q = np.asarray(current_logprobs, dtype=np.float64).reshape(-1)
    p = np.asarray(behaviour_logprobs, dtype=np.float64).reshape(-1)
    m = np.asarray(older, dtype=bool).reshape(-1)
    if not (q.shape == p.shape == m.shape):
        raise DataError(f"prefix_drift: shapes differ: {q.shape}, {p.shape}, {m.shape}")
    if not m.any():
        return 0.0
    d = np.abs(q[m] - p[m])
    if not np.isfinite(d).all():
        raise DataError("prefix_drift: non-finite log-probability in an older segment")
    return float(d.mean())
