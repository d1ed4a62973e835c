"""agentenv envs lists the installed peers' environments; ids register on first use, one at a time."""

from __future__ import annotations

import importlib.util
import json

import agentenv
from agentenv.adapters import ADAPTERS, installed_specs
from agentenv.registration_cli import list_envs_main


def test_agentenv_envs_lists_installed_peers(capsys) -> None:
    before = set(agentenv.registry)
    assert list_envs_main([]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "python_tool" in lines and "gym/<ID>" in lines
    assert "reasoning_gym/lcm" in lines and "reasoning_gym_tool/lcm" in lines
    assert "verifier" in lines["reasoning_gym/lcm"]
    for module, env_id in (("gem", "gem/game:GuessTheNumber-v0"), ("textarena", "textarena/GuessTheNumber-v0")):
        assert (env_id in lines) == (importlib.util.find_spec(module) is not None)
    assert "textarena/TicTacToe-v0" not in lines  # two players
    assert set(agentenv.registry) == before  # listing registers nothing
    assert list_envs_main(["--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["reasoning_gym/lcm"]["entry_point"] == "agentenv.adapters.reasoning_gym_env:ReasoningGymEnv"
    assert rows["gym/<ID>"]["pattern"] is True


def test_make_registers_only_the_id_asked_for() -> None:
    before = set(agentenv.registry)
    env = agentenv.make("reasoning_gym/lcm", size=2)
    assert set(agentenv.registry) - before == {"reasoning_gym/lcm"}
    assert agentenv.spec("reasoning_gym/lcm").kwargs == {"family": "lcm"} and env.tasks().ids == ("lcm/0", "lcm/1")
    specs = installed_specs()
    assert len({s.id for s in specs}) == len(specs) and {a.prefix for a in ADAPTERS} >= {
        s.id.split("/")[0] + "/" for s in specs}
