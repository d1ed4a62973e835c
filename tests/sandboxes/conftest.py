"""Fixtures: one real sandbox per test, for every backend (docker ones marked ``docker``)."""

from __future__ import annotations

import functools
import os

import pytest

from agentenv.sandboxes import SandboxLimits, create_sandbox

BACKENDS = ["process", "bwrap", pytest.param("docker", marks=pytest.mark.docker)]
LIMITS = SandboxLimits(timeout_s=5.0, output_bytes=4096, memory_bytes=512 << 20, max_processes=48)


@functools.lru_cache(maxsize=1)
def _available() -> dict[str, str]:
    from agentenv.sandboxes import available_backends

    return available_backends()


def skip_reason(backend: str) -> str:
    """Why ``backend`` cannot run here ("" when it can); asked once per test session."""
    return _available()[backend]


def require(backend: str) -> None:
    """Skip (with the reason) when ``backend`` does not work here; fail instead in CI, which installs
    bubblewrap and (when it exported DOCKER_HOST, i.e. ran scripts/install_docker.sh) a Docker daemon."""
    why = skip_reason(backend)
    if not why:
        return
    in_ci = bool(os.environ.get("CI"))
    if in_ci and (backend == "bwrap" or (backend == "docker" and os.environ.get("DOCKER_HOST"))):
        pytest.fail(f"{backend} backend must work in CI: {why}")
    pytest.skip(f"{backend} backend unavailable here: {why}")


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    require(request.param)
    return request.param


@pytest.fixture
async def sandbox(backend):
    sb = await create_sandbox(backend, LIMITS)
    yield sb
    await sb.close()
