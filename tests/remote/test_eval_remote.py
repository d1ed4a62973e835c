"""``agentenv eval --remote URL``: an env that is not installed here, evaluated on its ``agentenv serve`` server."""

from __future__ import annotations

import json

import httpx
import pytest

import agentenv
from agentenv import eval_command
from tests.fakes import CharRenderer, ScriptedEngine
from tests.remote.serving import GUESS_NUMBER_ID, running

pytestmark = [pytest.mark.timeout(120)]


def test_eval_plays_the_served_env_and_records_where(tmp_path, monkeypatch, capsys):
    assert GUESS_NUMBER_ID not in agentenv.registry
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (ScriptedEngine(["1"]), CharRenderer()))
    out = tmp_path / "eval"
    with running("--env-arg", "high=3") as server:
        argv = ["--env", GUESS_NUMBER_ID, "--remote", server.url, "--no-progress", "--out", str(out)]
        assert eval_command.main(argv) == 0
        health = httpx.get(server.url + "/health", timeout=10).json()
        assert eval_command.main([*argv[:4], "--env-arg", "high=5", "--out", str(tmp_path / "x")]) == 2
        assert "the server builds the env, so its arguments (high) go to it" in capsys.readouterr().err
    assert GUESS_NUMBER_ID not in agentenv.registry and health["sessions"] == 0
    report = json.loads((out / "report.json").read_text())
    # the server's env (high=3) dealt the tasks: "1" wins secret-1 at once, never the others
    assert [e["game"] for e in report["episodes"]] == ["secret-1", "secret-2", "secret-3"]
    assert report["overall"]["endings"] == {"truncated": 2, "won": 1}
    assert report["protocol"]["remote"] == [server.url] and report["protocol"]["env_kwargs"] == {}
    assert not (tmp_path / "x").exists()


def test_without_env_the_served_env_is_evaluated(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (ScriptedEngine(["2"]), CharRenderer()))
    with running("--env-arg", "high=2") as server:
        assert eval_command.main(["--remote", server.url, "--no-progress", "--out", str(tmp_path / "a")]) == 0
        # a named env that the server does not serve is refused before anything is played
        argv = ["--env", "alfworld", "--remote", server.url, "--no-progress", "--out", str(tmp_path / "b")]
        assert eval_command.main(argv) == 2
    assert f"serves '{GUESS_NUMBER_ID}', not 'alfworld'" in capsys.readouterr().err
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert report["env"] == GUESS_NUMBER_ID
    assert [e["game"] for e in report["episodes"]] == ["secret-1", "secret-2"] and report["overall"]["successes"] == 1
    assert not (tmp_path / "b").exists()


def test_eval_without_env_names_an_unreachable_server(tmp_path, capsys):
    assert eval_command.main(["--remote", "http://127.0.0.1:9", "--no-progress", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "agentenv eval: error: GET http://127.0.0.1:9/info" in err and "Traceback" not in err
    assert not (tmp_path / "a").exists()
