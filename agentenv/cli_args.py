"""Subcommand options read from typed dataclasses with tyro, under one set of conventions.

Each ``agentenv`` subcommand whose options are a dataclass (``eval``, ``export``, ``compare``,
``study``, ``simulate``, ``serve``, ``alfworld-oracle``, the learning report; ``train`` reads its own
with tyro too, keeping the config overrides apart) reads them here: the dataclass's fields are the
flags, its docstring their help. A flag given twice adds up when its field is a tuple (``--env-arg a=1
--env-arg b=2``); a bool field is a flag that sets it (no ``--no-`` twin) unless a command asks for
tyro's own conventions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def agentenv_conventions() -> tuple[Any, ...]:
    """Tyro's markers for agentenv's conventions: a repeated flag adds up, a bool is one flag."""
    import tyro

    return (tyro.conf.UseAppendAction, tyro.conf.FlagCreatePairsOff)


def parse(cls: type[T], argv: Sequence[str], *, prog: str, description: str,
          conventions: bool = True) -> T | int:
    """``cls`` read from ``argv``, or the exit status when there is nothing to run.

    Args:
        cls: The options' dataclass; its ``__post_init__`` may raise for values out of range.
        argv: The subcommand's arguments (without the program and subcommand names).
        prog: The program name the help and the messages show (``"agentenv export"``).
        description: The first paragraph of ``--help``.
        conventions: agentenv's (repeated flags add up, bools are one flag); False: tyro's defaults.

    Returns:
        The parsed options; or 0 after ``--help`` (printed), 2 after a flag or value that does not
        parse (tyro printed the message naming it on stderr).

    Raises:
        Whatever ``cls.__post_init__`` raises for a value out of range (e.g. ``ConfigError``).
    """
    import tyro

    try:
        return tyro.cli(cls, args=list(argv), prog=prog, description=description,
                        config=agentenv_conventions() if conventions else ())
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
