"""Adapter tests: ids an adapter registers on first use are removed afterwards (other tests iterate the registry)."""

from __future__ import annotations

import pytest

import agentenv


@pytest.fixture(autouse=True)
def registry_restored():
    before = set(agentenv.registry)
    yield
    for env_id in set(agentenv.registry) - before:
        agentenv.registry.pop(env_id, None)
