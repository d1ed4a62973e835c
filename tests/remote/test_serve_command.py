"""``agentenv serve``'s options are :class:`ServeConfig`'s fields, read with tyro; nothing is started here."""

from __future__ import annotations

from dataclasses import fields

import pytest

from agentenv.cli_args import parse
from agentenv.remote.server import TOKEN_ENV, ServeConfig, _command_options, main


def _read(*argv: str) -> ServeConfig | int:
    return parse(_command_options(), argv, prog="agentenv serve", description="test")


def test_every_field_of_the_config_is_a_flag_with_its_default(capsys):
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    flags = {f.name: "--" + f.name.replace("_", "-") for f in fields(ServeConfig)}
    flags.update(env_id="ENV_ID", env_kwargs="--env-arg")
    assert [name for name, flag in flags.items() if flag not in help_text] == []
    options = _read("examples/GuessNumber-v0")
    assert isinstance(options, ServeConfig)
    for f in fields(ServeConfig):
        if f.name not in ("env_id", "env_kwargs", "token"):
            assert getattr(options, f.name) == f.default, f.name


def test_env_args_add_up_as_yaml_values_and_flags_set_their_fields(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    options = _read("x", "--env-arg", "high=5", "--env-arg", "name=a b", "--env-arg", "ratio=0.5",
                    "--port", "0", "--max-sessions", "3", "--call-timeout-s", "2.5")
    assert options.env_kwargs == {"high": 5, "name": "a b", "ratio": 0.5}
    assert (options.env_id, options.port, options.max_sessions, options.call_timeout_s) == ("x", 0, 3, 2.5)
    assert options.token is None


def test_the_token_comes_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert _read("x").token == "from-env"
    assert _read("x", "--token", "from-flag").token == "from-flag"
    monkeypatch.setenv(TOKEN_ENV, "")
    assert _read("x").token is None


@pytest.mark.parametrize("argv", [["x", "--env-arg", "no-equals-sign"], ["x", "--bogus"], ["x", "--port", "eighty"],
                                  []])
def test_what_does_not_parse_is_status_2_naming_it(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert ("expected KEY=VALUE" in err) if "--env-arg" in argv else err


@pytest.mark.parametrize(("argv", "message"), [
    (["x", "--port", "70000"], "port must be in [0, 65535], got 70000"),
    (["x", "--max-sessions", "0"], "max_sessions and max_action_chars must be >= 1"),
    (["x", "--host", "0.0.0.0"], "host '0.0.0.0' is not loopback: serving it needs a token"),
])
def test_a_value_out_of_range_is_status_1_with_the_config_s_message(argv, message, capsys, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert main(argv) == 1
    assert f"agentenv serve: {message}" in capsys.readouterr().err
