"""``agentenv.rollout.forced_lag``: which snapshot the engine gets after each update, by hand-computed versions."""

from __future__ import annotations

import pytest

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.forced_lag import LaggedWeights, Snapshot
from agentenv.rollout.staleness import StalenessConfig


def test_the_engine_gets_each_snapshot_k_versions_late():
    lag = LaggedWeights(2, 0, "w0")
    released = [lag.push(v, f"w{v}") for v in range(1, 7)]
    # learner at 1, 2: the engine keeps version 0 (max(0, v - 2) = 0); at 3..6 it gets 1..4
    assert released == [None, None, Snapshot(1, "w1"), Snapshot(2, "w2"), Snapshot(3, "w3"), Snapshot(4, "w4")]
    assert lag.engine == Snapshot(4, "w4") and lag.held_versions == [4, 5, 6]  # k + 1 snapshots held


def test_skipped_versions_release_the_newest_due_snapshot_and_drop_the_older():
    lag = LaggedWeights(3, 10, "w10")  # a run resumed at version 10: the lag counts from there
    assert lag.push(11, "a") is None and lag.push(12, "b") is None
    assert lag.push(16, "c") == Snapshot(12, "b")  # 16 - 3 = 13: versions 11 and 12 are due, the newest wins
    assert lag.held_versions == [12, 16]
    assert lag.push(17, "d") is None  # 14: nothing new is due (16 is not)
    assert lag.push(19, "e") == Snapshot(16, "c")


def test_lag_zero_releases_at_once_and_bad_input_is_refused():
    lag = LaggedWeights(0, 0, "w0")
    assert lag.push(1, "w1") == Snapshot(1, "w1") and lag.held_versions == [1]
    with pytest.raises(DataError, match="version 1 after version 1; versions must increase"):
        lag.push(1, "again")
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="staleness.forced_lag must be an int >= 0"):
            LaggedWeights(bad, 0, None)


def test_a_rebuilt_engine_reads_the_lagged_weights():
    class Learner:
        model, version = "the model", 5

        def weights_for_engine(self):
            return "latest"

    lag = LaggedWeights(2, 0, "w0")
    for v in (1, 2, 3):
        lag.push(v, f"w{v}")
    source = lag.engine_source(Learner())
    assert (source.version, source.weights_for_engine(), source.model) == (1, "w1", "the model")


def test_forced_lag_config_errors_name_the_field():
    assert StalenessConfig().forced_lag == 0
    for bad in (-1, 2.0, True):
        with pytest.raises(ConfigError, match="staleness.forced_lag must be an int >= 0"):
            StalenessConfig(forced_lag=bad)
    with pytest.raises(ConfigError, match="forced_lag=4 with staleness.policy=max_lag and max_lag=3.0: once the lag"):
        StalenessConfig(policy="max_lag", max_lag=3.0, forced_lag=4)
    assert StalenessConfig(policy="max_lag", max_lag=4.0, forced_lag=4).forced_lag == 4
    assert StalenessConfig(policy="none", forced_lag=4).forced_lag == 4
