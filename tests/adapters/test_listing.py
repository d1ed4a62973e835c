"""agentenv envs lists the installed peers' environments; ids register on first use, one at a time."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import pytest

import agentenv
import agentenv.adapters as adapters
from agentenv.adapters import ADAPTERS, built_rows, installed_specs, listed_rows, listing
from agentenv.adapters.reasoning_gym_env import families
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


def test_the_saved_listing_is_what_the_peers_list_and_is_read_back_without_them(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    installed = [a for a in ADAPTERS if a.installed()]
    from_peers = {a.prefix: built_rows(a) for a in installed}  # each peer imported and asked
    assert [r.peer_id for r in from_peers["reasoning_gym/"]] == families()
    assert {a.prefix: listed_rows(a) for a in installed} == from_peers  # built, then saved
    assert len(list((tmp_path / "listing").glob("*.json"))) == len(installed)
    monkeypatch.setattr(adapters, "built_rows", lambda a: pytest.fail(f"{a.prefix} listed from the peer again"))
    assert {a.prefix: listed_rows(a) for a in installed} == from_peers  # read back from the files
    pairs = [(a, a.prefix + r.peer_id) for a in installed for r in from_peers[a.prefix]]
    full_import = [s for a, env_id in pairs if (s := adapters._spec(a, env_id)) is not None]
    assert installed_specs() == full_import and len(full_import) == sum(map(len, from_peers.values()))


def test_a_listing_saved_for_another_version_is_never_read(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    built = []

    def build(peer_id: str):
        return lambda: built.append(peer_id) or [listing.Row(peer_id, {"game": peer_id}, ())]

    real = listing.key("gym", "gymnasium")
    assert real is not None and real["version"] == importlib.metadata.version("gymnasium")
    assert listing.rows("gym", "gymnasium", build("A-v0"))[0].peer_id == "A-v0"
    assert listing.rows("gym", "gymnasium", build("B-v0"))[0].peer_id == "A-v0" and built == ["A-v0"]
    monkeypatch.setattr(listing.importlib.metadata, "version", lambda name: real["version"] + ".post1")
    assert listing.rows("gym", "gymnasium", build("C-v0")) == [listing.Row("C-v0", {"game": "C-v0"}, ())]
    assert built == ["A-v0", "C-v0"] and len(list((tmp_path / "listing").glob("gym-*.json"))) == 2


def test_a_listing_file_that_does_not_hold_its_key_is_rebuilt(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path))
    path = listing.listing_file(listing.key("gym", "gymnasium"))
    for content in ("not json", json.dumps({"key": {"version": "0"}, "rows": [{"peer_id": "Old-v0"}]})):
        path.write_text(content)
        assert listing.rows("gym", "gymnasium", lambda: [listing.Row("New-v0")]) == [listing.Row("New-v0")]
        assert json.loads(path.read_text())["rows"] == [{"peer_id": "New-v0", "kwargs": {}, "needs": []}]


def test_an_unwritable_cache_lists_afresh(tmp_path, monkeypatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path / "file"))  # not a folder: nothing can be saved
    assert listing.rows("gym", "gymnasium", lambda: [listing.Row("X-v0")]) == [listing.Row("X-v0")]
    assert listing.rows("gym", "gymnasium", lambda: [listing.Row("Y-v0")]) == [listing.Row("Y-v0")]


def test_agentenv_envs_imports_no_peer_once_listed(tmp_path) -> None:
    script = (
        "import sys; from agentenv.registration_cli import list_envs_main; list_envs_main([]); "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'reasoning_gym', 'gem', 'textarena'}))"
    )
    env = {**os.environ, "AGENTENV_CACHE": str(tmp_path)}
    argv = [sys.executable, "-c", script]
    runs = [subprocess.run(argv, env=env, capture_output=True, text=True, check=True) for _ in range(2)]
    peers = sorted(p for p in ("gem", "reasoning_gym", "textarena") if importlib.util.find_spec(p))
    assert runs[0].stdout.splitlines()[-1] == repr(peers)  # the first listing asks the peers
    assert runs[1].stdout.splitlines()[-1] == "[]"  # the second reads the saved listing
    assert runs[0].stdout.splitlines()[:-1] == runs[1].stdout.splitlines()[:-1]
