"""Hand-computed checks of the PACE maths in agentenv.rollout.staleness (docs/algorithms.md, "PACE")."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.staleness import (
    StalenessConfig,
    effective_staleness,
    excess,
    highest_first,
    pace_weights,
    percentile_rank,
    prefix_drift,
    rejection_budget,
    update_rate,
)


def test_percentile_rank_average_rank_over_n():
    # sorted: 0.1 (rank 1), 0.2 (rank 2), 0.3 0.3 (ranks 3, 4 -> 3.5 each); u = R / n with n = 4
    np.testing.assert_allclose(percentile_rank(np.array([0.3, 0.1, 0.3, 0.2])), [0.875, 0.25, 0.875, 0.5])
    np.testing.assert_allclose(percentile_rank(np.array([5.0])), [1.0])
    np.testing.assert_allclose(percentile_rank(np.zeros(4)), [0.625] * 4)  # (n + 1) / (2 n)
    np.testing.assert_allclose(percentile_rank(np.array([3.0, 1.0, 2.0])), [1.0, 1 / 3, 2 / 3])
    assert percentile_rank(np.zeros(0)).shape == (0,)
    with pytest.raises(DataError):
        percentile_rank(np.array([0.1, np.nan]))


def test_percentile_rank_matches_rankdata_on_random_ties():
    rng = np.random.default_rng(0)
    v = rng.integers(0, 7, size=200).astype(float)
    u = percentile_rank(v)
    # brute force: average 1-based rank = (#less) + (#equal + 1) / 2
    less = (v[None, :] < v[:, None]).sum(1)
    eq = (v[None, :] == v[:, None]).sum(1)
    np.testing.assert_allclose(u, (less + (eq + 1) / 2) / v.size)


def test_weights_and_effective_staleness():
    w = pace_weights(np.array([0.0, 0.1, 0.2, 0.5]), gamma=4.0)
    np.testing.assert_allclose(w, [0.25**4, 0.5**4, 0.75**4, 1.0])
    np.testing.assert_allclose(
        effective_staleness(np.array([4.0, 2.0]), np.array([0.0, 1.5]), np.array([0.00390625, 0.31640625])),
        [4.0, 2.474609375],
    )


def test_excess_rate_budget():
    assert excess(4, 2) == 0.5
    assert excess(2, 4) == 0.0 and excess(0, 4) == 0.0
    assert update_rate(0.0, 0.5, 0.9) == pytest.approx(0.05)
    assert update_rate(0.2, 0.0, 0.9) == pytest.approx(0.18)
    assert rejection_budget(0.5, 4, 2) == 2
    assert rejection_budget(0.125, 4, 2) == 1  # 0.5 rounds half up
    assert rejection_budget(0.124, 4, 2) == 0
    assert rejection_budget(0.9, 10, 4) == 6  # capped: never below the floor
    assert rejection_budget(0.3, 3, 4) == 0  # at or below target: nothing


def test_highest_first_breaks_ties_later_first():
    np.testing.assert_array_equal(highest_first(np.array([1.0, 2.0, 2.0, 0.0]), 2), [2, 1])
    np.testing.assert_array_equal(highest_first(np.array([1.0, 2.0, 2.0, 0.0]), 1), [2])
    np.testing.assert_array_equal(highest_first(np.array([1.0, 3.0]), 5), [1, 0])
    assert highest_first(np.array([1.0]), 0).shape == (0,)


def test_prefix_drift_only_older_tokens():
    q = np.array([-1.1, -0.7, -9.0, -9.0])
    p = np.full(4, -1.0)
    assert prefix_drift(q, p, np.array([True, True, False, False])) == pytest.approx(0.2)
    assert prefix_drift(q, p, np.zeros(4, bool)) == 0.0  # single-version trajectory
    with pytest.raises(DataError):
        prefix_drift(q[:3], p, np.ones(4, bool))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"policy": "fifo"}, {"drift_mode": "x"}, {"gamma": 0.0}, {"beta": 1.0}, {"beta": -0.1},
        {"max_lag": -1}, {"target_occupancy": 0}, {"target_occupancy": 2.5},
        {"gamma": float("nan")},
    ],
)
def test_config_rejects_bad_values(kwargs):
    with pytest.raises(ConfigError):
        StalenessConfig(**kwargs)


def test_config_defaults():
    c = StalenessConfig()
    got = (c.policy, c.gamma, c.beta, c.target_occupancy, c.drift_mode)
    assert got == ("pace", 4.0, 0.9, None, "scoring")
    with pytest.raises(AttributeError):
        c.policy = "none"  # frozen


def test_highest_first_matches_full_sort_with_ties():
    rng = np.random.default_rng(1)
    for _ in range(300):
        n = int(rng.integers(1, 50))
        s = rng.integers(0, 5, n).astype(float)
        k = int(rng.integers(0, n + 2))
        pos = np.arange(n)
        ref = sorted(range(n), key=lambda i: (-s[i], -pos[i]))[:k]
        np.testing.assert_array_equal(highest_first(s, k), ref)
