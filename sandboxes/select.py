"""Choosing a backend: the strongest one that works here, or an explicit choice.

``auto`` picks ``docker`` when a daemon answers a ping and the image is built, else ``bwrap`` when it
works here, else ``process``.
"""

from __future__ import annotations

import os

from agentenv.errors import ConfigError
from agentenv.sandboxes.base import SandboxLimits
from agentenv.sandboxes.session import Launcher

BACKENDS = ("docker", "bwrap", "process")


def _docker_status() -> tuple[bool, str]:
    from agentenv.sandboxes.docker_backend import docker_client
    from agentenv.sandboxes.image import IMAGE, image_exists

    client = docker_client(timeout=3)
    if client is None:
        return False, "no Docker daemon answers a ping" + (
            f" at DOCKER_HOST={os.environ['DOCKER_HOST']}" if os.environ.get("DOCKER_HOST") else "")
    try:
        if not image_exists(client):
            return False, (f"a Docker daemon answers but image {IMAGE} is not built "
                           "(agentenv sandbox build-image)")
    finally:
        client.close()
    return True, ""


def available_backends() -> dict[str, str]:
    """Each backend mapped to "" when it works here, else the reason it does not."""
    from agentenv.sandboxes.bwrap import bwrap_works

    docker_ok, docker_why = _docker_status()
    bwrap_ok, bwrap_why = bwrap_works()
    return {"docker": "" if docker_ok else docker_why, "bwrap": "" if bwrap_ok else bwrap_why, "process": ""}


def choose_backend(backend: str = "auto") -> str:
    """Resolve ``"auto"`` to the strongest backend that works here; check an explicit one exists.

    Raises:
        ConfigError: ``backend`` is not one of "auto", "docker", "bwrap", "process".
    """
    if backend not in ("auto", *BACKENDS):
        raise ConfigError(f"unknown sandbox backend {backend!r}; choose auto, docker, bwrap or process")
    if backend != "auto":
        return backend
    if _docker_status()[0]:
        return "docker"
    from agentenv.sandboxes.bwrap import bwrap_works

    return "bwrap" if bwrap_works()[0] else "process"


def make_launcher(backend: str, limits: SandboxLimits) -> Launcher:
    """Build the launcher of ``backend`` ("auto" resolved first).

    Raises:
        ConfigError: Unknown backend name, or a limit out of range.
        SandboxError: The backend does not work on this machine (the message says why).
    """
    from agentenv.sandboxes.session import check_limits

    check_limits(limits)
    backend = choose_backend(backend)
    if backend == "docker":
        from agentenv.sandboxes.docker_backend import DockerLauncher

        return DockerLauncher(limits)
    if backend == "bwrap":
        from agentenv.sandboxes.bwrap import BwrapLauncher

        return BwrapLauncher(limits)
    from agentenv.sandboxes.process import ProcessLauncher

    return ProcessLauncher(limits)


ISOLATION = {
    "docker": "container: no network, read-only root, uid 65534, cap_drop ALL, cgroup memory/cpu/pids",
    "bwrap": "namespaces (user/pid/net/ipc/uts), only /usr visible read-only, uid 65534, rlimits",
    "process": "rlimits; as root also a private uid, network namespace and private /tmp",
}


def backend_report(backend: str = "auto") -> dict[str, str]:
    """What ``backend`` resolves to here, how isolated it is, and why stronger ones were skipped."""
    avail = available_backends()
    chosen = choose_backend(backend)
    report = {"requested": backend, "backend": chosen, "isolation": ISOLATION[chosen]}
    for name in BACKENDS:
        report[f"{name}_available"] = "yes" if not avail[name] else f"no: {avail[name]}"
    if avail[chosen]:
        report["warning"] = f"{chosen} was requested but does not work here: {avail[chosen]}"
    return report
