"""The ``process`` backend: the worker as a plain subprocess under rlimits (the last resort).

As root the worker starts as root only to enter a new network and mount namespace (no network; the
root mount read-only; private tmpfs on /tmp, /var/tmp, /dev/shm and /run/lock, /tmp being its work
folder), then drops to a private unprivileged uid (RLIMIT_NPROC is ignored for root) with
no-new-privileges, and sets RLIMIT_AS, RLIMIT_CPU, RLIMIT_NPROC and RLIMIT_FSIZE. World-readable host
files stay readable: use bwrap or docker for filesystem isolation. Not as root it gets the rlimits
(no NPROC, which would count the user's own processes) and a temporary work folder only;
:attr:`isolation` says which.
"""

from __future__ import annotations

import json
import sys
import tempfile

from agentenv.sandboxes.base import ExecStatus, SandboxLimits
from agentenv.sandboxes.channel import WORKER_SOURCE
from agentenv.sandboxes.hostproc import allocate_uid, diagnose_state, is_root, kill_state, spawn
from agentenv.sandboxes.session import WorkerHandle, read_hello

FSIZE_BYTES = 64 << 20  #: largest file a snippet may write (RLIMIT_FSIZE), bytes


def worker_rlimits(limits: SandboxLimits, *, nproc: bool) -> dict:
    """The rlimits the worker sets on itself (bytes, processes, CPU seconds)."""
    rl = {"AS": limits.memory_bytes, "FSIZE": FSIZE_BYTES, "CPU": int(limits.cpu_time_s)}
    if nproc:
        rl["NPROC"] = limits.max_processes
    return rl


def frame_limit(limits: SandboxLimits) -> int:
    """Largest response frame (bytes): two capped streams, an error text and JSON escaping."""
    return 20 * limits.output_bytes + (1 << 16)  # 3 fields x 6 bytes per escaped control character


class ProcessLauncher:
    """Starts workers as subprocesses with rlimits (see the module docstring).

    Args:
        limits: Memory, process and CPU limits applied to each worker.
        python: The interpreter that runs the worker (default: this one's ``sys.executable`` base,
            the system ``python3`` when it exists).
    """

    backend = "process"

    def __init__(self, limits: SandboxLimits, python: str | None = None):
        self.limits = limits
        self.python = python or _system_python()

    async def start(self) -> WorkerHandle:
        """Start one worker. Raises SandboxError when it does not say hello."""
        root = is_root()
        cfg = {"rlimits": worker_rlimits(self.limits, nproc=root)}
        tmpdir = None
        if root:
            cfg.update(unshare=True, uid=allocate_uid(), workdir="/tmp")
        else:
            tmpdir = tempfile.mkdtemp(prefix="agentenv-sbx-")
            cfg["workdir"] = tmpdir
        argv = [self.python, "-I", "-c", WORKER_SOURCE, json.dumps(cfg)]
        channel, state = await spawn(argv, max_frame=frame_limit(self.limits), uid=None, tmpdir=tmpdir)
        state.uid = cfg.get("uid")
        handle = WorkerHandle(channel, state=state)
        try:
            return await read_hello(handle, "process")
        except BaseException:
            await kill_state(state)
            raise

    async def kill(self, handle: WorkerHandle) -> None:
        """Kill the worker, its process group and (root) every process of its uid."""
        await kill_state(handle.state)

    async def diagnose(self, handle: WorkerHandle) -> tuple[ExecStatus, str]:
        """Why the worker's output ended."""
        return await diagnose_state(handle.state)

    def isolation(self, hello: dict) -> str:
        """What this worker is isolated by, from its hello frame."""
        parts = ["rlimits AS/CPU/FSIZE" + ("/NPROC" if hello.get("uid", 0) != 0 and is_root() else "")]
        parts.append(f"uid {hello.get('uid')}")
        parts.append("no network (netns)" if hello.get("netns") else "network NOT isolated")
        if hello.get("mountns"):
            ro = "read-only" if hello.get("rootro") else "writable per permissions"
            parts.append(f"private tmpfs /tmp (mountns), root mount {ro}")
            parts.append("world-readable host files visible")
        else:
            parts.append("host filesystem visible")
        return "process: " + ", ".join(parts)


def _system_python() -> str:
    import shutil

    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable
