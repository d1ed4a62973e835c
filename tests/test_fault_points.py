"""``fault_point``: which arrival an ``AGENTENV_FAULT`` entry fires on (by count, every time, or by version)."""

from __future__ import annotations

import pytest

from agentenv.faults import InjectedFault, fault_point, reset_fault_points


@pytest.fixture
def faults(monkeypatch):
    reset_fault_points()
    yield lambda spec: monkeypatch.setenv("AGENTENV_FAULT", spec)
    reset_fault_points()


def fires(name: str, version: int | None = None) -> bool:
    try:
        fault_point(name, version)
    except InjectedFault:
        return True
    return False


def test_a_count_entry_fires_on_that_arrival_only(faults):
    faults("a:3,b:*")
    assert [fires("a") for _ in range(5)] == [False, False, True, False, False]
    assert [fires("b") for _ in range(3)] == [True] * 3
    assert not fires("c")


def test_a_version_entry_fires_once_at_the_first_arrival_at_or_past_its_version(faults):
    faults("engine.decode:v2")
    # versions as an engine serving them would pass: the 2 is skipped (a lagged engine may jump)
    assert [fires("engine.decode", v) for v in (0, 0, 1, 3, 3, 4)] == [False, False, False, True, False, False]
    assert not fires("engine.decode")  # a caller without a version never fires a version entry
    reset_fault_points()
    assert fires("engine.decode", 2)  # reset: it may fire again


def test_malformed_entries_never_fire(faults):
    faults("p:vx,p:v,p:0,p:-1,p")
    assert not any(fires("p", v) for v in range(4))
