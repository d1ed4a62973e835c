"""The ``docker`` backend: the worker as the main process of a locked-down container (Python docker SDK).

Each worker is a container of the locally built image (:mod:`agentenv.sandboxes.image`) with no
network (``network_mode="none"``), cgroup memory (swap included), CPU (``nano_cpus``) and pids limits,
a read-only root with tmpfs ``/work`` and ``/tmp``, user 65534, all capabilities dropped and
no-new-privileges. The host talks to the worker over the container's attached stdin/stdout (Docker's
multiplexed stream, demultiplexed here). Killing a worker removes its container, and with it every
process it started; a cgroup OOM kill is read back from the container state as ``OOM``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from dataclasses import dataclass
from typing import Any

from agentenv.errors import SandboxError
from agentenv.sandboxes.base import ExecStatus, SandboxLimits
from agentenv.sandboxes.channel import WORKER_SOURCE, Channel
from agentenv.sandboxes.image import IMAGE
from agentenv.sandboxes.process import frame_limit, worker_rlimits
from agentenv.sandboxes.session import WorkerHandle, read_hello

LABEL = "agentenv.sandbox"  #: label on every container this backend starts (for cleanup)
TMPFS_BYTES = 64 << 20  #: size of the /work and /tmp tmpfs mounts, bytes
_MUX = struct.Struct(">BxxxI")


def docker_client(timeout: float = 10.0):
    """``docker.from_env()`` after a successful ping, else None (no daemon answers)."""
    try:
        import docker

        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception:  # noqa: BLE001 - no SDK, no socket, daemon down: all mean "not available"
        return None


@dataclass
class ContainerState:
    """What a Docker worker holds on the host."""

    container: Any
    sock: Any  #: the attach socket object (kept referenced so it stays open)
    writer: asyncio.StreamWriter
    pump: asyncio.Task
    stderr_tail: bytearray


async def _demux(src: asyncio.StreamReader, out: asyncio.StreamReader, err: bytearray) -> None:
    """Split Docker's multiplexed attach stream: stdout into ``out``, stderr's last 4 KiB into ``err``."""
    try:
        while True:
            kind, size = _MUX.unpack(await src.readexactly(_MUX.size))
            payload = await src.readexactly(size)
            if kind == 1:
                out.feed_data(payload)
            else:
                err.extend(payload)
                del err[:-4096]
    except (asyncio.IncompleteReadError, ConnectionError, OSError):
        pass
    finally:
        out.feed_eof()


class DockerLauncher:
    """Starts workers as containers (see the module docstring).

    Args:
        limits: Memory, CPU and pids limits of each container.
        image: Image name; default the one ``agentenv sandbox build-image`` builds.
        client: A ``docker.DockerClient``; default ``docker.from_env()``.

    Raises:
        SandboxError: No daemon answers, or the image is not built.
    """

    backend = "docker"

    def __init__(self, limits: SandboxLimits, image: str = IMAGE, client=None):
        import docker.errors

        self.client = client or docker_client()
        if self.client is None:
            raise SandboxError("docker backend unavailable: no Docker daemon answers a ping "
                               "(start one with scripts/install_docker.sh, set DOCKER_HOST)")
        try:
            self.client.images.get(image)
        except docker.errors.ImageNotFound as e:
            raise SandboxError(f"docker image {image} not built; run `agentenv sandbox build-image`") from e
        self.limits, self.image = limits, image

    def _create(self):
        lim = self.limits
        rlimits = worker_rlimits(lim, nproc=False)
        del rlimits["AS"]  # memory is the cgroup's job here: an OOM kill is read back as OOM
        cfg = {"rlimits": rlimits, "workdir": "/work"}
        tmpfs_opts = f"rw,nosuid,nodev,size={TMPFS_BYTES},mode=1777,uid=65534,gid=65534"
        container = self.client.containers.create(
            self.image, command=["python3", "-I", "-c", WORKER_SOURCE, json.dumps(cfg)],
            user="65534:65534", stdin_open=True, network_mode="none",
            mem_limit=lim.memory_bytes, memswap_limit=lim.memory_bytes, nano_cpus=int(lim.cpus * 1e9),
            pids_limit=lim.max_processes, read_only=True, tmpfs={"/work": tmpfs_opts, "/tmp": tmpfs_opts},
            working_dir="/work", cap_drop=["ALL"], security_opt=["no-new-privileges"],
            environment={"HOME": "/work", "LANG": "C.UTF-8"}, labels={LABEL: "1"})
        try:
            sock = container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            container.start()
        except BaseException:
            container.remove(force=True)
            raise
        return container, sock

    async def start(self) -> WorkerHandle:
        """Create, attach and start one container. Raises SandboxError on any Docker failure."""
        import docker.errors

        try:
            container, sock = await asyncio.to_thread(self._create)
        except docker.errors.DockerException as e:
            raise SandboxError(f"docker worker did not start: {e}") from e
        raw = getattr(sock, "_sock", sock)
        src, writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        out = asyncio.StreamReader(limit=1 << 20)
        err = bytearray()
        pump = asyncio.create_task(_demux(src, out, err))

        async def send(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        state = ContainerState(container, sock, writer, pump, err)
        handle = WorkerHandle(Channel(out, send, frame_limit(self.limits)), state=state)
        try:
            return await read_hello(handle, "docker")
        except SandboxError as e:
            await self.kill(handle)
            raise SandboxError(f"{e}; container stderr: {bytes(err).decode(errors='replace')[-500:]}") from e
        except BaseException:
            await self.kill(handle)
            raise

    async def kill(self, handle: WorkerHandle) -> None:
        """Remove the container (kills every process in it)."""
        st: ContainerState = handle.state
        st.writer.close()
        st.pump.cancel()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(st.container.remove, force=True)

    async def diagnose(self, handle: WorkerHandle) -> tuple[ExecStatus, str]:
        """OOM when the cgroup OOM killer fired, else CRASHED with the exit code."""
        st: ContainerState = handle.state

        def inspect():
            with contextlib.suppress(Exception):
                st.container.wait(timeout=5)
            st.container.reload()
            return st.container.attrs.get("State", {})

        try:
            state = await asyncio.to_thread(inspect)
        except Exception as e:  # noqa: BLE001 - the container may already be gone
            return ExecStatus.CRASHED, f"the worker container died ({e})"
        if state.get("OOMKilled"):
            return ExecStatus.OOM, "the container passed its memory limit and was OOM-killed; state lost"
        return ExecStatus.CRASHED, f"the worker exited with status {state.get('ExitCode')}; state lost"

    def isolation(self, hello: dict) -> str:
        """What this worker is isolated by."""
        lim = self.limits
        return (f"docker: container {self.image}, network none, read-only root, tmpfs /work and /tmp, "
                f"uid {hello.get('uid')}, cap_drop ALL, no-new-privileges, cgroup memory "
                f"{lim.memory_bytes >> 20} MiB, cpus {lim.cpus:g}, pids {lim.max_processes}")
