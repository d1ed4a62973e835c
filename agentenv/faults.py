"""Faults of the parts: what broke, what replaced it, how long recovery took; and fault injection.

The parts of a run that can break without the policy's doing, and what happens then
(``docs/faults.md`` has the whole table):

* ``engine_rebuilds``: the generation engine raised :class:`~agentenv.errors.EngineDied` (its decode
  thread or process died, or a forward pass failed with requests in flight);
  :class:`~agentenv.engines.supervised.SupervisedEngine` built a fresh engine from the learner's
  latest weights and the in-flight episodes were requeued (their tasks, not their partial tokens).
* ``sandbox_replaced``: a sandbox worker timed out, crashed, ran out of memory or was found dead
  between two calls, and a fresh worker replaced it
  (:class:`~agentenv.sandboxes.session.WorkerSandbox`).
* ``env_replaced``: an episode failed (its environment raised, or any failure outside the policy) and
  the collector built a fresh environment for that slot (:class:`~agentenv.rollout.collector.RolloutCollector`).
* ``grader_kills`` / ``grader_crashes``: a grading worker passed its deadline and was killed, or died
  (:class:`~agentenv.envs.python_tool.grading.Grader`).

Each is recorded in the process-wide :data:`FAULTS` with its *time to recovery* (seconds from the
moment the fault was seen to the moment the replacement was serving); the training loop adds
:meth:`FaultLog.report` to every metrics row (``faults/<kind>``, ``faults/<kind>_total``,
``faults/<kind>_recovery_s_max``).

Injection (tests and ``benchmarks/bench_faults.py``): ``AGENTENV_FAULT=POINT:K[,POINT:K...]`` makes the
K-th arrival (1-based, counted in this process) at the named :func:`fault_point` raise
:class:`InjectedFault` (``POINT:*``: every arrival). ``POINT:vV`` fires once, at the first arrival
where the caller serves policy version ``>= V``: a fault placed after the V-th weight update, however
fast or slow the machine (a count of arrivals is not). Unset (the default), a fault point is one
environment lookup. The points:

* ``engine.decode``: in the transformers engine's decode thread, before a decode step, outside the
  step's own error handling: the thread dies (as on a device failure); it passes the engine's version;
* ``python_tool.step``: at the start of ``PythonToolEnv.step`` (the environment crashes).

Sandbox and grader faults are injected from outside, on the real worker processes (``SIGKILL`` a
sandbox worker, ``SIGSTOP`` a grading worker), so they need no point.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

__all__ = ["FAULTS", "KINDS", "FaultLog", "InjectedFault", "fault_point", "reset_fault_points"]

KINDS = ("engine_rebuilds", "sandbox_replaced", "env_replaced", "grader_kills", "grader_crashes")
"""The fault kinds counted in every metrics row (see the module docstring)."""


class InjectedFault(RuntimeError):
    """Raised by a :func:`fault_point` that ``AGENTENV_FAULT`` names (a test's or benchmark's fault)."""


_arrivals: dict[str, int] = {}
_fired: set[tuple[str, str]] = set()  # (point, "vV") entries that fired already (each fires once)
_arrivals_lock = threading.Lock()


def fault_point(name: str, version: int | None = None) -> None:
    """Raise :class:`InjectedFault` on the arrival ``AGENTENV_FAULT`` names for ``name``; else return.

    Args:
        name: The point's name (``engine.decode``, ``python_tool.step``).
        version: The policy version the caller serves now, for ``name:vV`` entries (None: such
            entries never fire here).

    ``name:*`` fires on every arrival; a malformed entry (no ``:K``, ``K`` not a positive integer) never fires.

    Raises:
        InjectedFault: This is the K-th arrival at ``name`` and ``AGENTENV_FAULT`` holds ``name:K``, or
            the first arrival with ``version >= V`` and it holds ``name:vV``.
    """
    spec = os.environ.get("AGENTENV_FAULT")
    if not spec:
        return
    wanted = [nth for point, _, nth in (p.strip().partition(":") for p in spec.split(",")) if point == name]
    if not wanted:
        return
    with _arrivals_lock:
        n = _arrivals[name] = _arrivals.get(name, 0) + 1
        due = [nth for nth in wanted if version is not None and nth[:1] == "v" and nth[1:].isdigit()
               and version >= int(nth[1:]) and (name, nth) not in _fired]
        _fired.update((name, nth) for nth in due)
    if due or any(nth == "*" or (nth.isdigit() and int(nth) == n) for nth in wanted):
        at = f"version {version}" if due else str(n)
        raise InjectedFault(f"injected fault at {name} {at} (AGENTENV_FAULT={spec})")


def reset_fault_points() -> None:
    """Forget the arrivals counted and the version entries fired so far (a test that sets ``AGENTENV_FAULT`` anew)."""
    with _arrivals_lock:
        _arrivals.clear()
        _fired.clear()


@dataclass
class _Kind:
    count: int = 0
    recovery_s: list[float] = field(default_factory=list)


class FaultLog:
    """Counts faults by kind with their recovery times; thread-safe (workers report from threads).

    Attributes:
        events: Every fault so far as ``(kind, wall-clock time it was recorded (Unix seconds), recovery
            seconds, details)``, oldest first (the last 10,000 kept); ``details`` is what the recording
            part added (the engine: ``version``, the version the rebuilt engine serves).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kinds: dict[str, _Kind] = {k: _Kind() for k in KINDS}
        self._reported: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.events: list[tuple[str, float, float, dict]] = []

    def record(self, kind: str, recovery_s: float, **details: object) -> None:
        """Count one fault of ``kind`` that took ``recovery_s`` seconds to recover from.

        Raises:
            KeyError: ``kind`` is not one of :data:`KINDS`.
        """
        with self._lock:
            k = self._kinds[kind]
            k.count += 1
            k.recovery_s.append(float(recovery_s))
            del k.recovery_s[:-1000]
            self.events.append((kind, time.time(), float(recovery_s), details))
            del self.events[:-10_000]

    def total(self, kind: str) -> int:
        """Faults of ``kind`` so far."""
        with self._lock:
            return self._kinds[kind].count

    def report(self) -> dict[str, float]:
        """One metrics row's fault figures; call once per update.

        Keys, for each kind of :data:`KINDS`: ``faults/<kind>`` (since the previous call),
        ``faults/<kind>_total`` and ``faults/<kind>_recovery_s_max`` (the longest recovery of the faults
        counted since the previous call, seconds; 0 when none).
        """
        row: dict[str, float] = {}
        with self._lock:
            for name, k in self._kinds.items():
                new = k.count - self._reported[name]
                recent = k.recovery_s[-new:] if new else []
                row[f"faults/{name}"] = new
                row[f"faults/{name}_total"] = k.count
                row[f"faults/{name}_recovery_s_max"] = max(recent, default=0.0)
                self._reported[name] = k.count
        return row

    def reset(self) -> None:
        """Forget every count (tests and benchmarks that run several loops in one process)."""
        with self._lock:
            self._kinds = {k: _Kind() for k in KINDS}
            self._reported = dict.fromkeys(KINDS, 0)
            self.events = []


FAULTS = FaultLog()
"""The process-wide fault log every part records into."""
