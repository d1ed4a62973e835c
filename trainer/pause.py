"""Named pause points, so that a test can kill a real run at a chosen moment (``AGENTENV_PAUSE_AT``).

``AGENTENV_PAUSE_AT=NAME:K`` makes the K-th arrival (1-based, counted in this process) at the pause
point ``NAME`` print ``agentenv: paused at NAME K`` to stderr and sleep for :data:`PAUSE_S` seconds,
long enough for the test to send SIGKILL there; then the run goes on as if nothing happened. Unset
(the default), a pause point is one dictionary lookup.

The points (``tests/trainer/test_resume_kill.py`` kills a run at each):

* ``update``: in the learner's worker thread, after the optimizer step and before the new weights
  reach the engine or anything of the update is logged (the event loop, and so the collector, runs on);
* ``checkpoint``: in the checkpoint writer, the weights, optimizer and RNG files written into the
  temporary folder, before ``meta.json`` and the rename that publishes it;
* ``saved``: in the checkpoint writer, right after ``latest`` names the new checkpoint.
"""

from __future__ import annotations

import os
import sys
import time

__all__ = ["PAUSE_S", "pause_point"]

PAUSE_S = 600.0
"""Seconds a pause point sleeps (the process is meant to be killed before it wakes)."""

_arrivals: dict[str, int] = {}


def pause_point(name: str) -> None:
    """Sleep here on the arrival ``AGENTENV_PAUSE_AT`` (``NAME:K``) names; return at once otherwise.

    A malformed value (no ``:K``, ``K`` not a positive integer) never pauses.
    """
    spec = os.environ.get("AGENTENV_PAUSE_AT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    _arrivals[name] = _arrivals.get(name, 0) + 1
    if nth.isdigit() and _arrivals[name] == int(nth):
        print(f"agentenv: paused at {name} {nth}", file=sys.stderr, flush=True)
        time.sleep(PAUSE_S)
