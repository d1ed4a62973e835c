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


GUESS_NUMBER_ID = "examples/GuessNumber-v0"


@pytest.fixture
def guess_number():
    """The example plugin (``examples/guess_number``) registered in this process, as its entry point would.

    Imported from the source folder (nothing is installed) and unregistered afterwards, so that
    ``tests/test_example_plugin.py`` can still discover it through a real install.
    """
    import sys

    import agentenv

    folder = str(REPO / "examples" / "guess_number")
    sys.path.insert(0, folder)
    try:
        import agentenv_guess_number

        agentenv.registry.pop(GUESS_NUMBER_ID, None)
        agentenv_guess_number.register_envs()
        yield GUESS_NUMBER_ID
    finally:
        agentenv.registry.pop(GUESS_NUMBER_ID, None)
        sys.modules.pop("agentenv_guess_number", None)
        sys.path.remove(folder)
