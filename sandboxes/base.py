"""The sandbox contract: a persistent Python worker per episode, behind one interface.

A sandbox runs snippets of untrusted Python one after another in the same interpreter, so variables
survive between calls like notebook cells. Backends (``docker``, ``bwrap``, ``process``) differ only in
how strongly the worker is isolated; every backend enforces a per-call timeout, an output cap and a
memory cap, and reports crashes, timeouts and out-of-memory kills as an :class:`ExecResult` status
(never as an exception to the caller). A worker that died is replaced before the next call.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class ExecStatus(str, enum.Enum):
    """How a snippet ended."""

    OK = "ok"  #: ran to the end
    ERROR = "error"  #: raised an exception (traceback in ``ExecResult.error``); state is kept
    TIMEOUT = "timeout"  #: passed the per-call time limit; the worker was replaced (state lost)
    CRASHED = "crashed"  #: the worker died (os._exit, segfault, killed); replaced (state lost)
    OOM = "oom"  #: passed the memory cap; the worker was replaced (state lost)


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one snippet.

    Attributes:
        status: See :class:`ExecStatus`.
        stdout: Captured standard output, decoded as UTF-8 with replacement, cut to the output cap.
        stderr: Captured standard error, same treatment.
        error: Traceback or reason text when ``status`` is not OK, else "".
        duration_s: Wall-clock seconds the snippet ran, excluding time spent waiting for a worker.
        output_truncated: True when stdout or stderr was cut to the cap.
        stdout_chars: Characters the snippet wrote to stdout, the ones past the cap included (bytes for
            output written straight to the file descriptor); None when the backend does not count them.
        stderr_chars: The same for stderr.
        worker_replaced: True when the worker was restarted after this call (state lost).
    """

    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    error: str = ""
    duration_s: float = 0.0
    output_truncated: bool = False
    worker_replaced: bool = False
    stdout_chars: int | None = None
    stderr_chars: int | None = None

    @property
    def ok(self) -> bool:
        """True when the snippet ran to the end without raising."""
        return self.status is ExecStatus.OK


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandbox.

    Attributes:
        timeout_s: Wall-clock seconds one snippet may run.
        output_bytes: Bytes of stdout (and of stderr) kept per snippet.
        memory_bytes: Address-space / cgroup memory cap of the worker.
        max_processes: Processes (pids) the worker may own.
        cpus: CPU share (Docker ``nano_cpus`` / 1e9); ignored where unsupported.
        cpu_time_s: CPU seconds the worker may use over its whole life (RLIMIT_CPU, a backstop;
            the per-call wall-clock limit is ``timeout_s``).
    """

    timeout_s: float = 10.0
    output_bytes: int = 16_384
    memory_bytes: int = 1 << 30
    max_processes: int = 64
    cpus: float = 1.0
    cpu_time_s: float = 3600.0


@runtime_checkable
class Sandbox(Protocol):
    """One persistent isolated Python worker."""

    backend: str  #: "docker", "bwrap" or "process"
    isolation: str  #: one line naming what is isolated (network, filesystem, user, limits)

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Run ``code`` in the worker's persistent namespace and return its :class:`ExecResult`."""
        ...

    async def close(self) -> None:
        """Kill the worker and everything it started. Safe to call twice."""
        ...
