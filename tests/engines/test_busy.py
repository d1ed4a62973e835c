"""The engine busy clock: overlapping requests count once, idle gaps not at all."""

from __future__ import annotations

import pytest

from agentenv.engines.base import SamplingParams
from agentenv.engines.busy import BusyClock, BusyTrackingEngine
from agentenv.errors import EngineError
from tests.fakes import FakeClock, ScriptedEngine


def test_overlapping_requests_count_once_and_gaps_not_at_all():
    t = FakeClock()
    clock = BusyClock(t)
    clock.start()          # A starts at 0
    t.now = 2.0
    clock.start()          # B starts at 2
    t.now = 3.0
    clock.stop()           # A ends at 3
    t.now = 5.0
    clock.stop()           # B ends at 5: busy 0..5
    t.now = 9.0            # idle 5..9
    assert clock.busy_seconds == 5.0
    clock.start()
    t.now = 10.5           # running stretch counts while in flight
    assert clock.busy_seconds == 6.5
    clock.stop()
    t.now = 20.0
    assert clock.busy_seconds == 6.5


def test_more_stops_than_starts_is_an_error():
    with pytest.raises(RuntimeError, match="without a matching start"):
        BusyClock().stop()


async def test_wrapper_times_generate_and_delegates_everything_else():
    t = FakeClock()
    inner = ScriptedEngine(["ab"], fail_on=1)
    engine = BusyTrackingEngine(inner, BusyClock(t))
    out = await engine.generate([1, 2], SamplingParams(max_new_tokens=8))
    assert out.token_ids[:2] == [ord("a"), ord("b")]
    with pytest.raises(EngineError):  # a failed request still stops the clock
        await engine.generate([1], SamplingParams(max_new_tokens=8))
    assert engine.clock._in_flight == 0
    await engine.update_weights({}, 3)
    assert engine.version == 3 and engine.max_context_tokens == inner.max_context_tokens

