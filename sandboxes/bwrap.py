"""The ``bwrap`` backend: the worker under Debian's bubblewrap.

The sandbox root is an empty read-only tmpfs with only ``/usr`` bound read-only (plus the merged-usr symlinks
``/lib``, ``/lib64``, ``/bin``, ``/sbin`` and the few ``/etc`` files the dynamic loader needs), fresh
``/proc`` and ``/dev``, tmpfs ``/tmp`` and ``/work`` (the work folder); never ``--ro-bind / /``. All
namespaces are unshared (user, pid, network, ipc, uts, cgroup), the worker runs as uid 65534 inside
and dies with its parent. As root, bwrap itself is started under a private unprivileged host uid, so
RLIMIT_NPROC counts this sandbox only and closing it can kill all its processes.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess

from agentenv.errors import SandboxError
from agentenv.sandboxes.base import ExecStatus, SandboxLimits
from agentenv.sandboxes.channel import WORKER_SOURCE
from agentenv.sandboxes.hostproc import allocate_uid, diagnose_state, is_root, kill_state, spawn
from agentenv.sandboxes.process import frame_limit, worker_rlimits
from agentenv.sandboxes.session import WorkerHandle, read_hello

SANDBOX_UID = 65534  #: uid and gid inside the sandbox
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")


def bwrap_argv(bwrap: str = "bwrap") -> list[str]:
    """The bubblewrap command line up to (not including) the program to run."""
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
            "--ro-bind", "/usr", "/usr"]
    for name in ("lib", "lib64", "bin", "sbin", "lib32", "libx32"):
        path = f"/{name}"
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in _ETC:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/work",
             "--remount-ro", "/", "--chdir", "/work",
             "--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
             "--setenv", "HOME", "/work"]
    return argv


@functools.lru_cache(maxsize=1)
def bwrap_works() -> tuple[bool, str]:
    """Whether bubblewrap can build this sandbox here (tried once per process), and why not."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False, "bwrap not installed (apt-get install bubblewrap)"
    kwargs = {"user": allocate_uid(), "group": None, "extra_groups": []} if is_root() else {}
    if kwargs:
        kwargs["group"] = kwargs["user"]
    try:
        proc = subprocess.run([*bwrap_argv(exe), "/usr/bin/python3", "-c", "print(1)"], capture_output=True,
                              timeout=20, env={}, **kwargs)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"bwrap failed to run: {e}"
    if proc.returncode != 0 or proc.stdout.strip() != b"1":
        return False, f"bwrap test failed: {proc.stderr.decode(errors='replace').strip()[:300]}"
    return True, ""


class BwrapLauncher:
    """Starts workers under bubblewrap (see the module docstring).

    Args:
        limits: Memory, process and CPU limits (rlimits set by the worker on itself).
        python: Interpreter inside the sandbox (must live under /usr).

    Raises:
        SandboxError: bwrap is missing or cannot create its namespaces here.
    """

    backend = "bwrap"

    def __init__(self, limits: SandboxLimits, python: str = "/usr/bin/python3"):
        ok, why = bwrap_works()
        if not ok:
            raise SandboxError(f"bwrap backend unavailable: {why}")
        self.limits, self.python = limits, python
        self._argv = bwrap_argv(shutil.which("bwrap") or "bwrap")

    async def start(self) -> WorkerHandle:
        """Start one worker. Raises SandboxError when it does not say hello."""
        root = is_root()
        uid = allocate_uid() if root else None
        cfg = {"rlimits": worker_rlimits(self.limits, nproc=root), "workdir": "/work"}
        argv = [*self._argv, self.python, "-I", "-c", WORKER_SOURCE, json.dumps(cfg)]
        channel, state = await spawn(argv, max_frame=frame_limit(self.limits), uid=uid, tmpdir=None)
        handle = WorkerHandle(channel, state=state)
        try:
            return await read_hello(handle, "bwrap")
        except BaseException:
            await kill_state(state)
            raise

    async def kill(self, handle: WorkerHandle) -> None:
        """Kill bwrap (its pid namespace dies with it) and every process of its host uid."""
        await kill_state(handle.state)

    async def diagnose(self, handle: WorkerHandle) -> tuple[ExecStatus, str]:
        """Why the worker's output ended."""
        return await diagnose_state(handle.state)

    def isolation(self, hello: dict) -> str:
        """What this worker is isolated by."""
        return ("bwrap: user/pid/net/ipc/uts/cgroup namespaces, no network, /usr read-only, tmpfs /tmp "
                f"and /work, uid {hello.get('uid')} inside, rlimits AS/CPU/FSIZE"
                + ("/NPROC (private host uid)" if is_root() else ""))
