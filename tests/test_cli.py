"""The ``agentenv`` command itself: ``--version``, and messages that name only flags that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from agentenv import paths
from agentenv.cli import main
from agentenv.errors import DataError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_is_the_installed_one(flag, capsys):
    assert main([flag]) == 0
    expected = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"agentenv {expected}\n"


def test_the_data_folder_message_names_flags_that_exist(tmp_path, monkeypatch):
    from agentenv.eval_command import parse_args

    monkeypatch.delenv("AGENTENV_DATA", raising=False)
    monkeypatch.setattr(paths, "_REPO", tmp_path / "checkout")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        paths.data_dir()
    msg = str(info.value)
    flags = re.findall(r"agentenv eval (--[\w-]+)", msg)
    assert flags == ["--data-root"] and "--data-dir" not in msg
    assert parse_args([*flags, "/data/alfworld"]).data_root == "/data/alfworld"  # the flag exists and takes PATH
    assert "env.kwargs.data_root=PATH" in msg  # train's override of the env argument data_root
