"""Every value of a typed config, with its type, default and documentation, read from the dataclasses.

The documentation of a config value lives once, beside the value: an attribute docstring (a string
right after the field) or an ``Args:`` / ``Attributes:`` entry of the class docstring (Google style).
:func:`config_fields` collects them for a nested frozen dataclass (``section.field`` names, as the
command line's overrides spell them); :func:`format_config_help` prints them, as
``agentenv train --help-config`` does.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import typing
from dataclasses import dataclass
from typing import Any

__all__ = ["ConfigField", "config_fields", "field_docs", "format_config_help"]

_SECTION = re.compile(r"^(Args|Arguments|Attributes):\s*$")
_ENTRY = re.compile(r"^(\w+)(?: \([^)]*\))?:\s*(.*)$")


@dataclass(frozen=True)
class ConfigField:
    """One config value: its dotted name, type, default and documentation (one paragraph)."""

    name: str
    type: str
    default: Any
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """The documentation of each field of dataclass ``cls`` (its own and its bases'), by field name.

    Attribute docstrings win over class-docstring entries; whitespace is folded to single spaces.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        docs.update(_docstring_entries(inspect.getdoc(klass) or ""))
        docs.update(_attribute_docstrings(klass))
    return docs


def _docstring_entries(doc: str) -> dict[str, str]:
    """``name: text`` entries under ``Args:`` / ``Attributes:`` (continuation lines indented deeper)."""
    out: dict[str, str] = {}
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        if not _SECTION.match(lines[i].strip()):
            i += 1
            continue
        i += 1
        base = None
        name = None
        while i < len(lines):
            line = lines[i]
            if not line.strip():
                i += 1
                continue
            indent = len(line) - len(line.lstrip())
            if base is None:
                base = indent
            if indent < base or (indent == 0 and line.strip().endswith(":")):
                break
            if indent == base:
                m = _ENTRY.match(line.strip())
                if m is None:
                    break
                name = m.group(1)
                out[name] = m.group(2)
            elif name is not None:
                out[name] += " " + line.strip()
            i += 1
    return {k: " ".join(v.split()) for k, v in out.items()}


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """Strings placed right after an annotated field in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0]
    out: dict[str, str] = {}
    statements = getattr(body, "body", [])
    for here, after in zip(statements, statements[1:], strict=False):
        if (isinstance(here, ast.AnnAssign) and isinstance(here.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            out[here.target.id] = " ".join(after.value.value.split())
    return out


def _type_name(tp: Any) -> str:
    if isinstance(tp, str):
        return tp
    if typing.get_origin(tp) is None and isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def config_fields(cls: type, prefix: str = "") -> list[ConfigField]:
    """Every leaf value of the (nested) config dataclass ``cls``, in declaration order.

    A field whose type is itself a config dataclass contributes its own fields under ``name.``.
    """
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out: list[ConfigField] = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        tp = hints.get(f.name, f.type)
        name = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += config_fields(tp, prefix=f"{name}.")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append(ConfigField(name, _type_name(tp), default, docs.get(f.name, "")))
    return out


def format_config_help(cls: type, section: str | None = None, width: int = 100) -> str:
    """The config values of ``cls`` (or of one ``section``), a paragraph each, for a terminal.

    Raises:
        KeyError: ``section`` names no field of ``cls``.
    """
    fields = config_fields(cls)
    if section is not None:
        fields = [f for f in fields if f.name == section or f.name.startswith(section + ".")]
        if not fields:
            raise KeyError(section)
    lines: list[str] = []
    for f in fields:
        lines.append(f"{f.name}: {f.type} = {f.default!r}")
        lines += textwrap.wrap(f.doc or "(undocumented)", width=width, initial_indent="    ",
                               subsequent_indent="    ")
    return "\n".join(lines)
