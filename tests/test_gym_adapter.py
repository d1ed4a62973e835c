"""SyncEnv and Gymnasium registration: gymnasium.make works and Gymnasium's env checker passes."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env

import agentenv
from agentenv.errors import ClosedError, ResetNeeded
from agentenv.gym_adapter import SyncEnv, gym_id, register_gymnasium_envs
from tests.tiny_env import RepeatNumberEnv


@pytest.fixture
def tiny_registered():
    agentenv.register("tests/RepeatNumber-v0", RepeatNumberEnv, description="test env")
    register_gymnasium_envs()
    yield "agentenv/tests.RepeatNumber-v0"
    agentenv.registry.pop("tests/RepeatNumber-v0", None)
    gymnasium.registry.pop("agentenv/tests.RepeatNumber-v0", None)


def test_sync_env_plays_an_episode() -> None:
    env = SyncEnv(RepeatNumberEnv())
    obs, info = env.reset(seed=7)
    n = info["n"]
    assert obs == f"Say {n}"
    assert env.step("nope") == ("wrong, try again", 0.0, False, False, {"tries": 1})
    assert env.step(str(n)) == ("correct", 1.0, True, False, {"tries": 2})
    with pytest.raises(ResetNeeded):
        env.step("x")
    env.close()
    env.close()
    assert env.env.closes == 1
    with pytest.raises(ClosedError):
        env.reset()


async def test_sync_env_works_inside_a_running_loop() -> None:
    env = SyncEnv(RepeatNumberEnv())
    obs, info = env.reset(seed=1)  # would fail with asyncio.run() here
    assert obs == f"Say {info['n']}"
    await asyncio.sleep(0)
    env.close()


def test_ids_and_registration(tiny_registered: str) -> None:
    assert gym_id("python_tool") == "agentenv/python_tool"
    assert "agentenv/python_tool" in gymnasium.registry and "agentenv/alfworld" in gymnasium.registry
    assert register_gymnasium_envs() == []  # idempotent
    env = gymnasium.make(tiny_registered, high=3)
    obs, info = env.reset(seed=0)
    assert 0 <= info["n"] < 3
    env.close()


def test_gymnasium_env_checker_on_tiny_env(tiny_registered: str) -> None:
    env = gymnasium.make(tiny_registered)
    gym_check_env(env.unwrapped)
    env.close()


def test_gymnasium_env_checker_on_python_tool(data_dir) -> None:
    env = gymnasium.make("agentenv/python_tool", dataset="aime24", sandbox_backend="process")
    gym_check_env(env.unwrapped)
    obs, info = env.reset(seed=3)
    assert info["problem_id"].startswith("aime24/")
    obs, reward, term, trunc, info = env.step(
        '<tool_call>{"name": "python", "arguments": {"code": "print(40 + 2)"}}</tool_call>'
    )
    assert obs == "status: ok\nstdout:\n42" and not term and not trunc and reward == 0.0
    assert "sandbox_s" not in info and env.unwrapped.last_timing["sandbox_s"] > 0  # timings moved aside
    env.close()


def test_module_colon_id_form() -> None:
    env = gymnasium.make(
        "agentenv.gym_adapter:agentenv/python_tool", dataset="amc23", sandbox_backend="process"
    )
    assert isinstance(env.unwrapped, SyncEnv)
    env.close()


def test_gymnasium_make_needs_only_import_agentenv() -> None:
    """A fresh interpreter: ``import agentenv`` alone makes the built-ins Gymnasium ids (nothing else imported)."""
    import subprocess
    import sys

    code = ("import sys, agentenv, gymnasium\n"
            "assert 'agentenv.gym_adapter' not in sys.modules and 'agentenv.envs.python_tool' not in sys.modules\n"
            "env = gymnasium.make('agentenv/python_tool', sandbox_backend='process')\n"
            "obs, info = env.reset(seed=3)\n"
            "print(type(env.unwrapped).__name__, isinstance(obs, str) and len(obs) > 0)\n"
            "env.close()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["SyncEnv", "True"]
