"""``agentenv train --help-config``: every config value with its type, default and documentation."""

from __future__ import annotations

import dataclasses

import pytest

from agentenv.config_help import config_fields, field_docs, format_config_help
from agentenv.trainer.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Inner:
    """An inner section.

    Attributes:
        depth: How deep, in layers; the text
            goes on here.
        width: Overridden below by the attribute docstring.
    """

    depth: int = 2
    width: float = 0.5
    """The width (attribute docstring)."""


@dataclasses.dataclass(frozen=True)
class Outer:
    """Args:
    name: The name.
    """

    name: str = "x"
    inner: Inner = dataclasses.field(default_factory=Inner)
    tags: tuple[str, ...] = ()
    """Tags."""


def test_docs_come_from_docstring_entries_and_attribute_docstrings():
    assert field_docs(Inner) == {"depth": "How deep, in layers; the text goes on here.",
                                 "width": "The width (attribute docstring)."}
    fields = config_fields(Outer)
    assert [(f.name, f.type, f.default, f.doc) for f in fields] == [
        ("name", "str", "x", "The name."),
        ("inner.depth", "int", 2, "How deep, in layers; the text goes on here."),
        ("inner.width", "float", 0.5, "The width (attribute docstring)."),
        ("tags", "tuple[str, ...]", (), "Tags."),
    ]
    assert format_config_help(Outer, "inner").splitlines()[0] == "inner.depth: int = 2"
    with pytest.raises(KeyError):
        format_config_help(Outer, "nope")


def _leaves(cls, prefix=""):
    out = []
    for f in dataclasses.fields(cls):
        tp = cls.__dataclass_fields__[f.name].type
        inner = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(inner):
            out += _leaves(type(inner), f"{prefix}{f.name}.")
        elif tp is not None:
            out.append(f"{prefix}{f.name}")
    return out


def test_every_training_config_value_is_listed_once_and_documented():
    fields = config_fields(TrainConfig)
    names = [f.name for f in fields]
    assert names == _leaves(TrainConfig) and len(set(names)) == len(names)
    undocumented = [f.name for f in fields if not f.doc]
    assert undocumented == []
    by_name = {f.name: f for f in fields}
    assert by_name["optim.warmup_ratio"].default == 0.0 and "share of the run" in by_name["optim.warmup_ratio"].doc
    assert by_name["run.entropy_probe"].default == 4


def test_agentenv_train_help_config(capsys):
    from agentenv.trainer.recipe import main

    with pytest.raises(SystemExit) as done:
        main(["--help-config", "run"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("run.run_dir: str = 'runs/python_tool_cpu'") and "run.entropy_probe: int = 4" in out
    assert not any(line.startswith(("optim.", "env.")) for line in out.splitlines())
    with pytest.raises(SystemExit) as bad:
        main(["--help-config", "optimizer"])
    assert bad.value.code == 2
    assert "no config section or value 'optimizer' (sections: env, model, rollout" in capsys.readouterr().err
