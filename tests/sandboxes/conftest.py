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


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    why = skip_reason(request.param)
    if why:
        if request.param == "bwrap" and os.environ.get("CI"):
            pytest.fail(f"bwrap must work in CI: {why}")
        pytest.skip(f"{request.param} backend unavailable here: {why}")
    return request.param


@pytest.fixture
async def sandbox(backend):
    sb = await create_sandbox(backend, LIMITS)
    yield sb
    await sb.close()
