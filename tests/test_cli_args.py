"""Subcommand options read from a dataclass: the exit statuses and the two conventions."""

from __future__ import annotations

from dataclasses import dataclass

from agentenv.cli_args import parse


@dataclass(frozen=True)
class Options:
    """Options of a test command.

    Attributes:
        name: A required name.
        tag: Tags; a repeated flag adds one.
        quick: A flag.
    """

    name: str
    tag: tuple[str, ...] = ()
    quick: bool = False


def test_options_parse_with_repeated_flags_adding_up_and_bools_as_one_flag():
    got = parse(Options, ["--name", "n", "--tag", "a", "--tag", "b", "--quick"], prog="t", description="d")
    assert got == Options(name="n", tag=("a", "b"), quick=True)


def test_tyros_own_conventions_take_a_list_after_one_flag_and_a_no_twin():
    got = parse(Options, ["--name", "n", "--tag", "a", "b", "--no-quick"], prog="t", description="d",
                conventions=False)
    assert got == Options(name="n", tag=("a", "b"), quick=False)


def test_help_is_status_0_and_a_bad_or_missing_flag_status_2(capsys):
    assert parse(Options, ["--help"], prog="t", description="the test command") == 0
    assert "the test command" in capsys.readouterr().out
    assert parse(Options, [], prog="t", description="d") == 2  # --name is required
    assert "--name" in capsys.readouterr().err
    assert parse(Options, ["--name", "n", "--no-quick"], prog="t", description="d") == 2  # no --no- twin here


def test_overrides_are_split_from_the_options_wherever_they_stand():
    from agentenv.configio import split_overrides

    argv = ["--only", "sync", "eval.problems=3", "--out", "d", "optim.lr=1e-5", "--tag=x", "stray"]
    assert split_overrides(argv) == (["--only", "sync", "--out", "d", "--tag=x", "stray"],
                                     ["eval.problems=3", "optim.lr=1e-5"])
