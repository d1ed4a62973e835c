"""Shared test fixtures: where the read-only shared data lives."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$AGENTENV_DATA`` or ``../shared/data`` beside the repository."""
    return Path(os.environ.get("AGENTENV_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    d = shared_data_dir()
    if not d.is_dir():
        pytest.fail(f"shared data not found at {d}; set AGENTENV_DATA")
    return d


@pytest.fixture(scope="session")
def testdata_dir() -> Path:
    return shared_data_dir().parent / "testdata"
