"""Host helpers for the subprocess-based backends: private uids and killing everything a uid owns.

Each process/bwrap sandbox started by root runs under its own unprivileged uid, so that RLIMIT_NPROC
(counted per uid) is per sandbox, sandboxes cannot signal or ptrace each other, and closing a sandbox
can kill every process it left, even ones that escaped its process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import signal
from dataclasses import dataclass

from agentenv.errors import SandboxError
from agentenv.sandboxes.base import ExecStatus
from agentenv.sandboxes.channel import Channel

UID_BASE = 1_000_000  #: first uid handed out (above every normal and systemd-dynamic uid)
_UID_SPAN = 4096
_counter = itertools.count()


def is_root() -> bool:
    """True when this process can drop to other uids and create namespaces freely."""
    return os.geteuid() == 0


def allocate_uid() -> int:
    """A uid no other live sandbox of this host process uses (distinct per host process too)."""
    base = UID_BASE + (os.getpid() % 4096) * _UID_SPAN
    return base + next(_counter) % _UID_SPAN


def pids_of_uid(uid: int) -> list[int]:
    """Live (not zombie) pids whose real uid is ``uid`` (one pass over /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"State:") and line.split()[1] in (b"Z", b"X"):
                        break  # a zombie holds nothing; its parent (maybe init) reaps it
                    if line.startswith(b"Uid:"):
                        if int(line.split()[1]) == uid:
                            found.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return found


def kill_uid(uid: int, rounds: int = 5) -> int:
    """SIGKILL every process of ``uid`` (repeated: a fork bomb may fork between rounds); return count."""
    total = 0
    for _ in range(rounds):
        pids = pids_of_uid(uid)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                total += 1
            except OSError:
                pass
    return total


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (ignore a group already gone)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- workers as host subprocesses (process and bwrap backends) -------------------------------------

WORKER_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp"}


@dataclass
class ProcState:
    """What a subprocess worker holds on the host."""

    proc: asyncio.subprocess.Process
    uid: int | None = None  #: private uid (root only): every process of it is killed on close
    tmpdir: str | None = None  #: host folder removed on close


async def spawn(argv: list[str], *, max_frame: int, uid: int | None, tmpdir: str | None,
                cwd: str | None = None) -> tuple[Channel, ProcState]:
    """Start ``argv`` in a new session (process group), optionally as ``uid``; wire up its channel.

    Raises:
        SandboxError: The program cannot be executed.
    """
    kwargs = {}
    if uid is not None:
        kwargs = {"user": uid, "group": uid, "extra_groups": []}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, env=WORKER_ENV, cwd=cwd or "/",
            limit=1 << 20, **kwargs)
    except OSError as e:
        raise SandboxError(f"cannot start the sandbox worker ({argv[0]}): {e}") from e

    async def send(data: bytes) -> None:
        proc.stdin.write(data)
        await proc.stdin.drain()

    return Channel(proc.stdout, send, max_frame), ProcState(proc, uid, tmpdir)


async def kill_state(state: ProcState) -> None:
    """Kill the worker's process group, then (root) every process of its uid; reap; remove tmpdir."""
    kill_group(state.proc.pid)
    if state.uid is not None:
        await asyncio.to_thread(kill_uid, state.uid)
    with contextlib.suppress(asyncio.TimeoutError, ProcessLookupError):
        await asyncio.wait_for(state.proc.wait(), 10)
    if state.proc.stdin is not None:
        state.proc.stdin.close()
    # Let the pipe see EOF so that its transport closes. RuntimeError: a call in flight is already
    # reading this stream (close() during run()); that reader gets the EOF and reports the close.
    with contextlib.suppress(asyncio.TimeoutError, OSError, RuntimeError):
        await asyncio.wait_for(state.proc.stdout.read(), 2)
    if state.tmpdir:
        shutil.rmtree(state.tmpdir, ignore_errors=True)


async def diagnose_state(state: ProcState) -> tuple[ExecStatus, str]:
    """CRASHED with the exit reason (a worker out of memory reports OOM itself before exiting)."""
    try:
        code = await asyncio.wait_for(state.proc.wait(), 5)
    except asyncio.TimeoutError:
        return ExecStatus.CRASHED, "the worker closed its output but did not exit"
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.valid_signals() else str(-code)
        hint = " (the kernel OOM killer or a CPU-time limit may have sent it)" if name in ("SIGKILL",
                                                                                           "SIGXCPU") else ""
        return ExecStatus.CRASHED, f"the worker was killed by {name}{hint}; state lost"
    return ExecStatus.CRASHED, f"the worker exited with status {code} (os._exit?); state lost"
