"""Typed configs from YAML and back: frozen dataclasses are the truth, YAML is a saved dataclass.

``load_config(cls, data)`` builds a (nested) frozen dataclass from a mapping, checking every key and
every value's type, so a recipe with a typo or a wrong type fails at once with a ``ConfigError``
that names the field. ``apply_overrides`` applies ``section.field=value`` strings (YAML-parsed
values) on top, the way command-line overrides do.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agentenv.errors import ConfigError

T = TypeVar("T")


def _check(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _check(value, arm, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} matches none of {tp}")
    if origin is typing.Literal:
        if value not in typing.get_args(tp):
            raise ConfigError(f"{where}: {value!r} is not one of {typing.get_args(tp)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping for {tp.__name__}, got {value!r}")
        return load_config(tp, value, where=where)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        args = typing.get_args(tp)
        item = args[0] if args else Any
        return origin(_check(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{where}: expected a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if isinstance(tp, type) and issubclass(tp, str):  # str enums
        try:
            return tp(value)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    if isinstance(tp, type) and not isinstance(value, tp):
        raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value


def load_config(cls: type[T], data: Mapping[str, Any], *, where: str = "") -> T:
    """Build dataclass ``cls`` from ``data``, checking keys and types recursively.

    A dataclass may name where its retired fields went in a ``MOVED_FIELDS`` class attribute
    (``{"old": "where it lives now"}``); the unknown-field error then says so. A field retired for a
    fixed value is listed in ``FIXED_FIELDS`` (``{"old": (value, "why")}``): a config that gives it at
    that value (one saved before it was retired) loads as if the key were absent; any other value is
    refused with the reason.

    Raises:
        ConfigError: An unknown key, a value of the wrong type, or a value the dataclass's own
            ``__post_init__`` rejects; the message names the dotted field.
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    data = _drop_fixed(cls, data, where)
    unknown = set(data) - fields
    if unknown:
        moved = getattr(cls, "MOVED_FIELDS", {})
        hint = "; ".join(f"{k} is now {moved[k]}" for k in sorted(unknown) if k in moved)
        hint = f" (written by an older agentenv? {hint})" if hint else ""
        raise ConfigError(f"{where or cls.__name__}: unknown field(s) {sorted(unknown)}{hint}; known: {sorted(fields)}")
    kwargs = {k: _check(v, hints[k], f"{where + '.' if where else ''}{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from exc


def _drop_fixed(cls: type, data: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``data`` without the retired fields of ``cls`` that hold their fixed value (see :func:`load_config`)."""
    fixed = getattr(cls, "FIXED_FIELDS", {})
    for key in set(data) & set(fixed):
        value, why = fixed[key]
        given = data[key]
        if isinstance(value, float) and isinstance(given, str):  # YAML 1.1 reads "1e-8" as a string
            try:
                given = float(given)
            except ValueError:
                pass
        if given != value:
            raise ConfigError(f"{where + '.' if where else ''}{key} is no longer a setting: it is fixed at {value!r} "
                              f"({why}); remove it from the config")
    return {k: v for k, v in data.items() if k not in fixed}


def to_dict(cfg: Any) -> dict[str, Any]:
    """A plain nested dict of a dataclass config (enums as their values), ready for YAML."""

    def plain(v: Any) -> Any:
        if dataclasses.is_dataclass(v):
            return {f.name: plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, str):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, Mapping):
            return {k: plain(x) for k, x in v.items()}
        return v

    return plain(cfg)


def apply_overrides(data: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply ``"a.b.c=value"`` overrides to a nested dict (values parsed as YAML scalars).

    Raises:
        ConfigError: An override without ``=``.
    """
    out = yaml.safe_load(yaml.safe_dump(data)) or {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r} must look like section.field=value")
        node = out
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {p!r} is not a section")
        node[parts[-1]] = yaml.safe_load(raw)
    return out


def is_override(token: str) -> bool:
    """Whether a command-line token is a ``section.field=value`` override: it holds ``=`` and is not a flag.

    The key is checked when the override is applied (:func:`apply_overrides`, :func:`load_config`).
    """
    return "=" in token and not token.startswith("-")


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(options, overrides)``: the tokens of ``argv`` that are not overrides, then those that are.

    Overrides are told apart by :func:`is_override` and may stand anywhere on a command line; each
    list keeps the order of ``argv``.
    """
    return [a for a in argv if not is_override(a)], [a for a in argv if is_override(a)]


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping.

    Raises:
        ConfigError: The file does not exist or does not hold a mapping.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {p} does not exist")
    data = yaml.safe_load(p.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p} must hold a mapping at the top level")
    return data


def key_values(items: Sequence[str], flag: str) -> dict[str, Any]:
    """``KEY=VALUE`` items of a repeated ``flag`` as a dict, each VALUE read as YAML.

    Raises:
        ConfigError: An item without ``=`` or with an empty key (the message names ``flag``).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out
