"""One sandbox: a persistent worker started by a backend launcher, with timeout, caps and replacement.

The backend-specific part (how to start, kill and diagnose a worker) is a :class:`Launcher`; this
module holds everything the backends share: the per-call wall-clock timeout (measured from the moment
the request is sent, so waiting for the lock or for a replacement worker never counts), crash and OOM
detection, and the transparent replacement of a dead worker (started in the background right away, so
the next call usually finds it ready).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from agentenv.errors import ClosedError, ConfigError, SandboxError
from agentenv.faults import FAULTS
from agentenv.sandboxes.base import ExecResult, ExecStatus, SandboxLimits
from agentenv.sandboxes.channel import Channel, ProtocolError

START_TIMEOUT_S = 60.0  #: seconds a worker may take to say it is ready


@dataclass
class WorkerHandle:
    """A started worker: its protocol channel, its hello message and backend-specific state."""

    channel: Channel
    hello: dict = field(default_factory=dict)
    state: Any = None


class Launcher(Protocol):
    """How one backend starts, kills and diagnoses workers."""

    backend: str

    async def start(self) -> WorkerHandle:
        """Start a worker and return it once it sent its hello frame. Raises SandboxError."""
        ...

    async def kill(self, handle: WorkerHandle) -> None:
        """Kill the worker and every process it started; release its resources."""
        ...

    async def diagnose(self, handle: WorkerHandle) -> tuple[ExecStatus, str]:
        """After the worker's output ended: OOM or CRASHED, and a reason line."""
        ...

    def isolation(self, hello: dict) -> str:
        """One line naming what is isolated, given the worker's hello frame."""
        ...


def _checked(resp: dict) -> dict:
    """The response frame with its types checked (a snippet can write to the worker's descriptors).

    Raises:
        ProtocolError: A field is missing or of the wrong type, or the status is unknown.
    """
    ok = resp.get("status") in ("ok", "error", "oom") and all(
        isinstance(resp.get(k), str) for k in ("stdout", "stderr", "error"))
    if not ok:
        raise ProtocolError(f"malformed worker response (keys {sorted(resp)[:8]})")
    return resp


def check_limits(limits: SandboxLimits) -> None:
    """Raise ConfigError when a limit is out of range (every one must be positive)."""
    for name in ("timeout_s", "output_bytes", "memory_bytes", "max_processes", "cpus", "cpu_time_s"):
        value = getattr(limits, name)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"SandboxLimits.{name} must be a positive number, got {value!r}")
    if limits.memory_bytes < 64 << 20:
        raise ConfigError("SandboxLimits.memory_bytes must be >= 64 MiB to start Python, "
                          f"got {limits.memory_bytes}")


async def read_hello(handle: WorkerHandle, what: str) -> WorkerHandle:
    """Wait (bounded) for the worker's hello frame and store it in ``handle``.

    Raises:
        SandboxError: The worker died or stayed silent for :data:`START_TIMEOUT_S` seconds.
    """
    try:
        hello = await asyncio.wait_for(handle.channel.receive(), START_TIMEOUT_S)
    except (asyncio.IncompleteReadError, ProtocolError, asyncio.TimeoutError, ConnectionError) as e:
        raise SandboxError(f"{what} worker did not start: {type(e).__name__}: {e}") from e
    if not hello.get("ready"):
        raise SandboxError(f"{what} worker sent {hello!r} instead of its hello")
    handle.hello = hello
    return handle


def _alive(handle: WorkerHandle | None) -> bool:
    """False when ``handle``'s host process has exited (process and bwrap backends); else True."""
    proc = getattr(handle.state, "proc", None) if handle is not None else None
    return proc is None or getattr(proc, "returncode", None) is None


def _count_replacement(task: asyncio.Task, t0: float) -> None:
    if not task.cancelled() and task.exception() is None:
        FAULTS.record("sandbox_replaced", time.monotonic() - t0)


class WorkerSandbox:
    """A :class:`~agentenv.sandboxes.base.Sandbox` backed by a persistent worker.

    Build one with :func:`agentenv.sandboxes.create_sandbox` (or get one from a pool); call
    :meth:`start` before the first :meth:`run` to pay the start-up cost up front.

    Args:
        launcher: The backend.
        limits: Per-call timeout, output cap and the limits the launcher applies.
    """

    def __init__(self, launcher: Launcher, limits: SandboxLimits):
        check_limits(limits)
        self._launcher, self.limits = launcher, limits
        self.backend: str = launcher.backend
        self.isolation: str = ""
        self._handle: WorkerHandle | None = None
        self._next: asyncio.Task | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        self._background: set[asyncio.Task] = set()
        self.calls = 0  #: snippets run so far (a pool never hands out a sandbox with calls > 0)
        self.replacements = 0  #: workers replaced after a timeout, crash or OOM

    @property
    def ready(self) -> bool:
        """True when a live worker waits for a snippet."""
        return self._handle is not None and not self._closed

    @property
    def alive(self) -> bool:
        """False when the worker's process is known to have exited (host-process backends); else True."""
        return _alive(self._handle)

    async def start(self) -> WorkerSandbox:
        """Start the worker now (idempotent). Raises SandboxError, ClosedError."""
        if self._closed:
            raise ClosedError("sandbox is closed")
        if self._handle is None:
            await self._take_worker()
        return self

    async def _take_worker(self) -> None:
        task, self._next = self._next, None
        handle = await (task if task is not None else self._launcher.start())
        if self._closed:  # closed while starting
            await self._launcher.kill(handle)
            raise ClosedError("sandbox is closed")
        self._handle = handle
        self.isolation = self._launcher.isolation(handle.hello)

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        """Run ``code`` in the persistent namespace.

        Args:
            code: Python source (a cell).
            timeout_s: Wall-clock seconds for this call; default ``limits.timeout_s``. Counted from the
                moment the worker receives the request (waiting for a worker does not count).

        Returns:
            The :class:`ExecResult`; timeouts, crashes and OOM are statuses, not exceptions.

        Raises:
            ClosedError: The sandbox was closed.
            SandboxError: No worker could be started at all, or the worker died between two calls
                (killed from outside while idle: its state is lost, which is not the snippet's doing;
                a replacement is started for a later call).
            TypeError: ``code`` is not a string.
            ConfigError: ``timeout_s`` is not a positive number.
        """
        if not isinstance(code, str):
            raise TypeError(f"code must be str, not {type(code).__name__}")
        timeout = self.limits.timeout_s if timeout_s is None else float(timeout_s)
        if not timeout > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        async with self._lock:
            if self._closed:
                raise ClosedError("sandbox is closed")
            if self._handle is None:
                await self._take_worker()
            handle = self._handle
            if not _alive(handle):  # died while idle (killed from outside): not the snippet's doing
                _, reason = await self._launcher.diagnose(handle)
                await self._replace(None)
                raise SandboxError(f"the sandbox worker died between two calls ({reason}); its state is lost, "
                                   "so the episode cannot go on")
            self.calls += 1
            t0 = time.monotonic()
            try:
                await handle.channel.send({"code": code, "cap": self.limits.output_bytes})
                resp = _checked(await asyncio.wait_for(handle.channel.receive(), timeout))
            except asyncio.CancelledError:
                self._abandon()  # the snippet may still run: its answer must never reach a later call
                raise
            except asyncio.TimeoutError:
                return await self._replace(
                    ExecResult(ExecStatus.TIMEOUT, error=f"TimeoutError: the snippet passed {timeout:g} s",
                               duration_s=time.monotonic() - t0, worker_replaced=True))
            except (asyncio.IncompleteReadError, ConnectionError, ProtocolError) as e:
                if self._closed:
                    status, reason = ExecStatus.CRASHED, "the sandbox was closed during the call"
                elif isinstance(e, ProtocolError):
                    status, reason = ExecStatus.CRASHED, str(e)
                else:
                    status, reason = await self._launcher.diagnose(handle)
                return await self._replace(
                    ExecResult(status, error=reason, duration_s=time.monotonic() - t0, worker_replaced=True))
            duration = time.monotonic() - t0
            status = ExecStatus(resp["status"])
            result = ExecResult(status, stdout=resp["stdout"], stderr=resp["stderr"],
                                error=resp["error"], duration_s=duration,
                                output_truncated=bool(resp.get("truncated")),
                                worker_replaced=status is ExecStatus.OOM,
                                stdout_chars=resp.get("stdout_chars"), stderr_chars=resp.get("stderr_chars"))
            if status is ExecStatus.OOM:
                return await self._replace(result)
            return result

    async def _replace(self, result: ExecResult | None) -> ExecResult | None:
        """Kill the current worker and start its replacement in the background.

        The replacement is counted in :data:`agentenv.faults.FAULTS` (``sandbox_replaced``) once it said
        hello, with the seconds from here to then.
        """
        t0 = time.monotonic()
        handle, self._handle = self._handle, None
        self.replacements += 1
        if handle is not None:
            await self._launcher.kill(handle)
        if not self._closed:
            self._next = asyncio.create_task(self._launcher.start())
            self._next.add_done_callback(lambda task: _count_replacement(task, t0))
        return result

    def _abandon(self) -> None:
        """On cancellation: kill the worker in the background and start its replacement."""
        handle, self._handle = self._handle, None
        self.replacements += 1
        if handle is not None:
            task = asyncio.create_task(self._launcher.kill(handle))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        if not self._closed and self._next is None:
            self._next = asyncio.create_task(self._launcher.start())

    async def close(self) -> None:
        """Kill the worker, its replacement (if starting) and everything they started. Idempotent."""
        if self._closed:
            return
        self._closed = True
        handle, self._handle = self._handle, None
        task, self._next = self._next, None
        if handle is not None:
            await self._launcher.kill(handle)
        if task is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await self._launcher.kill(await task)
        for bg in list(self._background):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await bg

    async def __aenter__(self) -> WorkerSandbox:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"WorkerSandbox(backend={self.backend!r}, calls={self.calls}, closed={self._closed})"
