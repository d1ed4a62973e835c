"""The example plugin package installs separately and is found through the agentenv.envs entry points."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import agentenv
from agentenv.checker import check_env
from agentenv.registration import load_plugins
from agentenv.registration_cli import list_envs_main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "guess_number"
ENV_ID = "examples/GuessNumber-v0"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install --no-deps --target`` a copy of the example (the repo tree stays clean)."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(EXAMPLE, src)
    target = tmp / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        timeout=180,
    )
    assert list(target.glob("agentenv_guess_number-*.dist-info/entry_points.txt"))
    sys.path.insert(0, str(target))
    importlib.invalidate_caches()
    loaded = load_plugins(force=True)
    yield loaded
    agentenv.registry.pop(ENV_ID, None)
    sys.path.remove(str(target))
    sys.modules.pop("agentenv_guess_number", None)


async def test_plugin_is_discovered_and_plays(installed) -> None:
    assert "guess_number" in installed
    env = agentenv.make(ENV_ID, high=20)
    assert type(env).__name__ == "GuessNumberEnv" and env.high == 20
    obs, _ = await env.reset(seed=0, options={"secret": 13})
    assert "from 1 to 20" in obs
    assert (await env.step("10")).observation == "Higher."
    assert (await env.step("I say 15")).observation == "Lower."
    r = await env.step("13")
    assert (r.observation, r.reward, r.terminated) == ("Correct!", 1.0, True)
    report = await check_env(agentenv.make(ENV_ID), actions=["50"])
    assert report.checks[-1] == "close_twice" and "step_after_end_raises" in report.checks


def test_cli_lists_the_plugin(installed, capsys) -> None:
    assert list_envs_main([]) == 0
    out = capsys.readouterr().out
    assert "examples/GuessNumber-v0" in out and "higher/lower" in out and "python_tool" in out
    assert list_envs_main(["--json"]) == 0
    assert '"id": "examples/GuessNumber-v0"' in capsys.readouterr().out


def test_gymnasium_sees_the_plugin(installed) -> None:
    import gymnasium

    from agentenv.gym_adapter import register_gymnasium_envs

    register_gymnasium_envs()
    env = gymnasium.make("agentenv/examples.GuessNumber-v0", high=5)
    obs, _ = env.reset(seed=1)
    assert "from 1 to 5" in obs
    env.close()
    gymnasium.registry.pop("agentenv/examples.GuessNumber-v0", None)
