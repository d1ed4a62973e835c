"""What a peer's game needs besides its package, read from the peer's source, and whether this machine has it.

A game's needs are found without importing it (importing some games downloads data): from its
module's source and from the sources of the modules it imports from its own package, followed import
by import (``ast``; packages' ``__init__`` files are not followed). A need is a string ``KIND:WHAT``:

==========================  ===================================================  ========================
need                        found from                                           met when
==========================  ===================================================  ========================
``nltk:PACKAGE``            a call ``nltk.download("PACKAGE")`` (or of a list)   ``nltk.data.find`` finds
                                                                                 ``PACKAGE`` in one of
                                                                                 NLTK's data folders
``online:VARIABLE``         a use of TextArena's ``OpenRouterAgent`` (an online  ``VARIABLE`` is set
                            model that plays the game master)
``compile:FILE line N: E``  a module that does not compile on this Python        never
==========================  ===================================================  ========================

Checking a need reads files and environment variables only: nothing is downloaded and no network is
touched (an ``online:`` need met here still needs the network when the game runs).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path

#: NLTK's data folders (the downloader's ``subdir`` of a package), where ``nltk.data.find`` looks for one.
NLTK_FOLDERS = ("corpora", "taggers", "tokenizers", "chunkers", "grammars", "misc", "models", "sentiment", "stemmers")

#: Names of peers' online agents -> the environment variable holding the key each one needs.
ONLINE_AGENTS = {"OpenRouterAgent": "OPENROUTER_API_KEY"}


def source_needs(module: str) -> tuple[str, ...]:
    """The needs of ``module`` (``"pkg.sub.mod"``) and of the modules it imports from its own package, sorted.

    Read from the installed source files, never imported; a module without a source file adds none.
    """
    top = module.partition(".")[0] + "."
    seen: set[str] = set()
    found: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        needs, imports = _scan(name, follow_package=name == module)
        found.update(needs)
        todo += [i for i in imports if i.startswith(top)]
    return tuple(sorted(found))


def _source_file(module: str) -> tuple[Path, str] | None:
    """``module``'s source file and its path shown from the top package's folder, found without importing."""
    try:
        top = importlib.util.find_spec(module.partition(".")[0])
    except (ImportError, ValueError):
        return None
    if top is None or not top.submodule_search_locations:
        return None
    root = Path(next(iter(top.submodule_search_locations))).parent
    base = root.joinpath(*module.split("."))
    for path in (base.with_name(base.name + ".py"), base / "__init__.py"):
        if path.is_file():
            return path, path.relative_to(root).as_posix()
    return None


@functools.lru_cache(maxsize=1024)
def _scan(module: str, *, follow_package: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``module``'s own needs and the modules it imports (``follow_package=False``: a package reads as empty)."""
    found = _source_file(module)
    if found is None or (found[0].name == "__init__.py" and not follow_package):
        return (), ()
    path, shown = found
    try:
        with warnings.catch_warnings():  # the peer's invalid escapes and the like are its own business
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=shown)
    except SyntaxError as exc:
        return (f"compile:{shown} line {exc.lineno}: {exc.msg}",), ()
    except (OSError, ValueError):  # unreadable, or not UTF-8
        return (), ()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    needs: list[str] = []
    imports: list[str] = []
    for node in ast.walk(tree):
        needs += _node_needs(node)
        imports += _node_imports(node, package)
    return tuple(needs), tuple(imports)


def _node_needs(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Call) and _is_nltk_download(node.func):
        args = [*node.args[:1], *(k.value for k in node.keywords if k.arg == "info_or_id")]
        items = [e for a in args for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
        return [f"nltk:{i.value}" for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    return [f"online:{ONLINE_AGENTS[name]}"] if name in ONLINE_AGENTS else []


def _is_nltk_download(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "download"
        and isinstance(func.value, ast.Name)
        and func.value.id == "nltk"
    )


def _node_imports(node: ast.AST, package: str) -> list[str]:
    """Modules an ``import`` node may load: ``from a import b`` gives ``a`` and ``a.b``; relative ones resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - node.level + 1], *([node.module] if node.module else [])])
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def unmet(needs: Iterable[str]) -> list[str]:
    """The needs this machine does not meet, in order, each once (files and environment variables only)."""
    return [need for need in dict.fromkeys(needs) if not _met(need)]


def _met(need: str) -> bool:
    kind, _, what = need.partition(":")
    if kind == "nltk":
        return nltk_has(what)
    if kind == "online":
        return bool(os.environ.get(what))
    return False  # compile:..., never


def nltk_has(package: str) -> bool:
    """Whether NLTK's data package ``package`` (``"words"``) is installed where ``nltk.data.find`` looks.

    False when NLTK itself is not installed. Nothing is downloaded.
    """
    if importlib.util.find_spec("nltk") is None:
        return False
    import nltk.data

    for resource in (f"{folder}/{package}{end}" for folder in NLTK_FOLDERS for end in ("/", "")):
        try:  # "x/" finds a folder, unpacked or in x.zip, as NLTK's loaders ask; "x" an unpacked file
            nltk.data.find(resource)
            return True
        except LookupError:
            continue
    return False


def unavailable_reason(needs: Iterable[str]) -> str | None:
    """Why a game with ``needs`` cannot be built here, each unmet need with how to meet it; None when it can."""
    missing = unmet(needs)
    if not missing:
        return None
    by_kind: dict[str, list[str]] = {}
    for need in missing:
        kind, _, what = need.partition(":")
        by_kind.setdefault(kind, []).append(what)
    parts = []
    if nltk := by_kind.pop("nltk", []):
        parts.append(f"needs NLTK data {', '.join(map(repr, nltk))}: python -m nltk.downloader {' '.join(nltk)}")
    parts += [
        f"needs {v} set and network access: an online model plays the game master" for v in by_kind.pop("online", [])
    ]
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    parts += [f"does not compile on Python {python}: {where}" for where in by_kind.pop("compile", [])]
    parts += [f"needs {kind}:{what}" for kind, whats in by_kind.items() for what in whats]
    return "; ".join(parts)
