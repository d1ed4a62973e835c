"""Is a held-out improvement real? Paired bootstrap and two-proportion intervals for success rates.

A training run evaluates the same held-out tasks before and after training, so the two success
vectors are *paired* (task ``i`` before against task ``i`` after). The paired bootstrap resamples
tasks with replacement and recomputes the mean difference (Efron & Tibshirani 1993, ch. 13,
percentile interval); it is tighter than an unpaired interval when the same tasks tend to succeed
in both. The two-proportion (Wald) interval ignores the pairing and is given beside it as the
conservative reference: ``(p_a - p_b) +- z * sqrt(p_a (1-p_a) / n_a + p_b (1-p_b) / n_b)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

from agentenv.errors import DataError

__all__ = [
    "ImprovementInterval", "detectable_effect", "paired_bootstrap", "seed_bootstrap", "seed_task_bootstrap",
    "seeds_for_effect", "two_proportion_interval",
]

#: Two-sided 95% normal quantile.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class ImprovementInterval:
    """The change in success rate from ``before`` to ``after`` with a 95% interval.

    Attributes:
        before / after: Success rates (fractions in [0, 1]).
        delta: ``after - before`` (fraction; 0.15 is 15 points).
        low / high: Bounds of the 95% interval of ``delta``.
        tasks: Paired tasks (bootstrap) or the smaller sample size (two-proportion).
        method: ``"paired_bootstrap"`` or ``"two_proportion"``.
    """

    before: float
    after: float
    delta: float
    low: float
    high: float
    tasks: int
    method: str

    @property
    def excludes_zero(self) -> bool:
        """The interval lies entirely above or entirely below 0."""
        return self.low > 0 or self.high < 0

    def to_dict(self) -> dict[str, float | int | str | bool]:
        """Plain values for JSON (with ``excludes_zero``)."""
        return {**asdict(self), "excludes_zero": self.excludes_zero}


def _as_outcomes(x: Sequence[float], name: str) -> np.ndarray:
    a = np.asarray(list(x), dtype=np.float64)
    if a.size == 0:
        raise DataError(f"{name}: no outcomes")
    if not np.isfinite(a).all() or (a < 0).any() or (a > 1).any():
        raise DataError(f"{name}: outcomes must be success indicators in [0, 1]")
    return a


def paired_bootstrap(before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000,
                     seed: int = 0) -> ImprovementInterval:
    """Percentile 95% interval of ``mean(after) - mean(before)`` resampling paired tasks.

    Args:
        before: ``(n,)`` per-task success (1/0, or a per-task success rate over samples) before training.
        after: ``(n,)`` the same tasks, in the same order, after training.
        resamples: Bootstrap resamples (>= 100).
        seed: Seeds the resampling (the interval is reproducible).

    Returns:
        :class:`ImprovementInterval` with ``method="paired_bootstrap"``.

    Raises:
        DataError: Empty or unequal-length inputs, values outside [0, 1], ``resamples < 100``.
    """
    b, a = _as_outcomes(before, "before"), _as_outcomes(after, "after")
    if b.size != a.size:
        raise DataError(f"paired outcomes need equal lengths, got {b.size} before and {a.size} after")
    if resamples < 100:
        raise DataError(f"resamples must be >= 100, got {resamples}")
    diff = a - b
    low, high = _mean_interval(diff, resamples, seed)
    return ImprovementInterval(float(b.mean()), float(a.mean()), float(diff.mean()), low, high,
                               int(diff.size), "paired_bootstrap")


def seed_task_bootstrap(before: Sequence[Sequence[float]], after: Sequence[Sequence[float]], *,
                        resamples: int = 10_000, seed: int = 0) -> ImprovementInterval:
    """95% interval of the mean change over runs of different seeds, resampling seeds, then tasks.

    Each resample draws ``k`` runs with replacement from the ``k`` given, and ``n`` task indices with
    replacement (the same tasks for every run: all runs were evaluated on the same ``n`` held-out
    tasks), and takes the mean over the drawn runs of ``mean(after) - mean(before)`` on the drawn
    tasks. The interval thus carries both the seed-to-seed spread and the tasks' sampling noise.

    Args:
        before: ``(k, n)`` per-run, per-task success before training (1/0 or rates in [0, 1]).
        after: ``(k, n)`` the same runs and tasks after training.
        resamples: Bootstrap resamples (>= 100).
        seed: Seeds the resampling.

    Returns:
        :class:`ImprovementInterval` with ``method="seed_task_bootstrap"``, ``tasks`` = ``n``;
        ``before``/``after``/``delta`` are the means over runs.

    Raises:
        DataError: No runs, runs of different task counts, values outside [0, 1], ``resamples < 100``.
    """
    if not before or len(before) != len(after):
        raise DataError(f"need the same number (>= 1) of runs before and after, got {len(before)} and {len(after)}")
    b = np.stack([_as_outcomes(x, "before") for x in before]) if len({len(x) for x in before}) == 1 else None
    a = np.stack([_as_outcomes(x, "after") for x in after]) if len({len(x) for x in after}) == 1 else None
    if b is None or a is None or b.shape != a.shape:
        raise DataError("every run must be evaluated on the same number of held-out tasks")
    if resamples < 100:
        raise DataError(f"resamples must be >= 100, got {resamples}")
    diff = a - b  # (k, n)
    k, n = diff.shape
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        runs = rng.integers(0, k, size=k)
        tasks = rng.integers(0, n, size=n)
        means[i] = diff[np.ix_(runs, tasks)].mean()
    low, high = np.quantile(means, [0.025, 0.975])
    return ImprovementInterval(float(b.mean()), float(a.mean()), float(diff.mean()), float(low), float(high),
                               int(n), "seed_task_bootstrap")


def two_proportion_interval(before: Sequence[float], after: Sequence[float]) -> ImprovementInterval:
    """Wald 95% interval of the difference of two independent success proportions.

    Args:
        before: ``(n_b,)`` success indicators before training.
        after: ``(n_a,)`` success indicators after training (pairing ignored).

    Returns:
        :class:`ImprovementInterval` with ``method="two_proportion"`` (``tasks`` = ``min(n_a, n_b)``).

    Raises:
        DataError: Empty inputs or values outside [0, 1].
    """
    b, a = _as_outcomes(before, "before"), _as_outcomes(after, "after")
    pb, pa = float(b.mean()), float(a.mean())
    se = math.sqrt(pa * (1 - pa) / a.size + pb * (1 - pb) / b.size)
    d = pa - pb
    return ImprovementInterval(pb, pa, d, d - Z95 * se, d + Z95 * se, int(min(a.size, b.size)), "two_proportion")


def seed_bootstrap(differences: Sequence[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Percentile 95% interval of the mean of per-seed differences, resampling seeds.

    For a figure measured once per run (tool calls per episode, failed trajectories' length): each
    seed's value in one setting minus the same seed's in the reference.

    Args:
        differences: ``(k,)`` one difference per seed (finite).
        resamples: Bootstrap resamples (>= 100).
        seed: Seeds the resampling.

    Returns:
        ``(low, high)``; one seed gives ``(d, d)`` (no spread to resample: read it with the seed count).

    Raises:
        DataError: No differences, a non-finite one, ``resamples < 100``.
    """
    d = np.asarray(list(differences), dtype=np.float64)
    if d.size == 0 or not np.isfinite(d).all():
        raise DataError(f"a seed bootstrap needs one finite difference per seed, got {list(differences)}")
    if resamples < 100:
        raise DataError(f"resamples must be >= 100, got {resamples}")
    return _mean_interval(d, resamples, seed)


def _mean_interval(values: np.ndarray, resamples: int, seed: int) -> tuple[float, float]:
    """Percentile 95% interval of ``values.mean()``, resampling the ``(n,)`` values with replacement."""
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(resamples, values.size))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return float(low), float(high)


def _z_sum(power: float, alpha: float) -> float:
    if not 0.0 < alpha < 1.0 or not 0.0 < power < 1.0:
        raise DataError(f"alpha and power must lie in (0, 1), got alpha={alpha}, power={power}")
    return NormalDist().inv_cdf(1 - alpha / 2) + NormalDist().inv_cdf(power)


def seeds_for_effect(sd: float, effect: float, *, power: float = 0.8, alpha: float = 0.05) -> int:
    """Seeds per setting to detect a difference ``effect`` between two settings' means.

    The two-sample normal approximation, ``k = ceil(2 (z_{1-alpha/2} + z_power)^2 sd^2 / effect^2)``
    (at least 2): ``sd`` is one run's spread (the seed-to-seed standard deviation of held-out success,
    the evaluation's noise included), the same in both settings. Conservative for seeds paired across
    settings (a shared seed's task stream makes the runs' errors correlate, which only helps).

    Args:
        sd: The spread of one run's result (points or fractions, as ``effect``; > 0).
        effect: The difference to detect (> 0, same unit).
        power: The chance of detecting a true difference of ``effect``.
        alpha: The two-sided test's level (the interval is ``1 - alpha``).

    Raises:
        DataError: ``sd`` or ``effect`` not positive, ``power`` or ``alpha`` outside (0, 1).
    """
    if not sd > 0 or not effect > 0:
        raise DataError(f"sd and effect must be > 0, got sd={sd}, effect={effect}")
    return max(2, math.ceil(2 * (_z_sum(power, alpha) * sd / effect) ** 2 - 1e-9))


def detectable_effect(sd: float, seeds: int, *, power: float = 0.8, alpha: float = 0.05) -> float:
    """The smallest difference between two settings of ``seeds`` runs each detected with ``power``.

    The inverse of :func:`seeds_for_effect`: ``(z_{1-alpha/2} + z_power) sd sqrt(2 / seeds)``, in ``sd``'s unit.

    Raises:
        DataError: ``sd`` not positive, ``seeds < 1``, ``power`` or ``alpha`` outside (0, 1).
    """
    if not sd > 0 or seeds < 1:
        raise DataError(f"sd must be > 0 and seeds >= 1, got sd={sd}, seeds={seeds}")
    return _z_sum(power, alpha) * sd * math.sqrt(2 / seeds)
