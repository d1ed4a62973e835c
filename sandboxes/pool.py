"""A warm pool of sandboxes: workers started ahead so an episode never waits for a start.

``acquire()`` hands out a started, never-used sandbox (one episode, one sandbox); ``release()`` closes
it (its namespace holds the episode's state, so it is never handed out again) and the pool starts a
fresh one in the background to keep ``size`` ready. A sandbox whose worker could not start is dropped
and retried, with a bounded number of consecutive failures before ``acquire()`` raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from agentenv.errors import ClosedError, ConfigError, SandboxError
from agentenv.faults import FAULTS
from agentenv.sandboxes.base import SandboxLimits
from agentenv.sandboxes.select import ISOLATION, make_launcher
from agentenv.sandboxes.session import Launcher, WorkerSandbox

MAX_START_FAILURES = 5  #: consecutive failed background starts before the pool waits for the next acquire()


class SandboxPool:
    """Keeps ``size`` started sandboxes ready.

    Args:
        launcher: The backend (from :func:`agentenv.sandboxes.select.make_launcher`).
        limits: Limits of every sandbox.
        size: Sandboxes kept started ahead (0: start on demand).

    Attributes:
        backend: Name of the backend.
        isolation: One line describing the isolation (filled once a sandbox started).
        waits: acquire() calls that found no ready sandbox and had to wait for a start.
    """

    def __init__(self, launcher: Launcher, limits: SandboxLimits, size: int = 4):
        if size < 0:
            raise ConfigError(f"pool size must be >= 0, got {size}")
        self._launcher, self.limits, self.size = launcher, limits, size
        self.backend: str = launcher.backend
        self.isolation: str = ISOLATION.get(launcher.backend, "")  # refined once a worker said hello
        self._ready: asyncio.Queue[WorkerSandbox] = asyncio.Queue()
        self._starting: set[asyncio.Task] = set()
        self._out: set[WorkerSandbox] = set()
        self._closed = False
        self._failures = 0
        self._last_error: BaseException | None = None
        self.waits = 0

    async def start(self) -> SandboxPool:
        """Start the pool's sandboxes and wait until all ``size`` are ready (warm).

        Raises:
            SandboxError: The backend cannot start workers (after the first failure).
        """
        self._refill()
        while self._ready.qsize() < self.size and self._starting:
            await asyncio.wait(set(self._starting), return_when=asyncio.FIRST_COMPLETED)
            if self._failures and self._ready.qsize() == 0:
                raise SandboxError(f"{self.backend} sandboxes do not start: {self._last_error}")
        return self

    def _refill(self) -> None:
        while not self._closed and self._ready.qsize() + len(self._starting) < self.size:
            task = asyncio.create_task(self._start_one())
            self._starting.add(task)
            task.add_done_callback(self._starting.discard)

    async def _start_one(self) -> None:
        sb = WorkerSandbox(self._launcher, self.limits)
        try:
            await sb.start()
        except Exception as e:  # noqa: BLE001 - counted and surfaced by acquire()
            self._failures += 1
            self._last_error = e
            await sb.close()
            if self._failures < MAX_START_FAILURES:
                self._refill()
            return
        self._failures = 0
        self.isolation = sb.isolation
        if self._closed:
            await sb.close()
        else:
            self._ready.put_nowait(sb)

    async def acquire(self) -> WorkerSandbox:
        """A started sandbox nobody used; waits for a start only when none is ready.

        A ready sandbox whose worker died while it waited is closed and replaced by a fresh one for this
        caller (counted in :data:`agentenv.faults.FAULTS` as ``sandbox_replaced``).

        Raises:
            ClosedError: The pool is closed.
            SandboxError: No sandbox was ready and starting one failed.
        """
        if self._closed:
            raise ClosedError("sandbox pool is closed")
        dead_since = None
        try:
            sb = self._ready.get_nowait()
            if not sb.alive:  # a warm worker that died while it waited: never handed out
                dead_since = time.monotonic()
                await sb.close()
                raise asyncio.QueueEmpty
        except asyncio.QueueEmpty:
            self.waits += 1  # cold: start one for this caller now (the pool keeps refilling too)
            sb = WorkerSandbox(self._launcher, self.limits)
            try:
                await sb.start()
            except BaseException:
                await sb.close()
                raise
            self._failures = 0
            self.isolation = sb.isolation
            if dead_since is not None:
                FAULTS.record("sandbox_replaced", time.monotonic() - dead_since)
        self._out.add(sb)
        self._refill()
        return sb

    async def release(self, sandbox: WorkerSandbox) -> None:
        """Give a sandbox back: it is closed (its state belongs to one episode) and replaced."""
        self._out.discard(sandbox)
        await sandbox.close()
        self._refill()

    async def close(self) -> None:
        """Close every ready, starting and handed-out sandbox. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._starting):
            with contextlib.suppress(BaseException):
                await task
        while not self._ready.empty():
            await self._ready.get_nowait().close()
        for sb in list(self._out):
            await sb.close()
        self._out.clear()

    async def __aenter__(self) -> SandboxPool:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def create_sandbox_pool(backend: str = "auto", size: int = 4,
                        limits: SandboxLimits | None = None) -> SandboxPool:
    """Build a pool (not yet started: ``await pool.start()`` to warm it, or let acquire() start).

    Args:
        backend: "auto" (docker, else bwrap, else process), "docker", "bwrap" or "process".
        size: Sandboxes kept started ahead.
        limits: Per-sandbox limits; default :class:`SandboxLimits()`.

    Raises:
        ConfigError: Unknown backend or negative size.
        SandboxError: The requested backend does not work on this machine.
    """
    limits = limits or SandboxLimits()
    return SandboxPool(make_launcher(backend, limits), limits, size)


async def create_sandbox(backend: str = "auto", limits: SandboxLimits | None = None) -> WorkerSandbox:
    """Start one sandbox outside any pool (close it yourself, or use ``async with``).

    Raises:
        ConfigError: Unknown backend.
        SandboxError: The backend does not work here or the worker did not start.
    """
    limits = limits or SandboxLimits()
    return await WorkerSandbox(make_launcher(backend, limits), limits).start()
