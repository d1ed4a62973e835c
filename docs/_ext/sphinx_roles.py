"""Griffe extension: check and link the Sphinx roles the docstrings use (``:class:`~agentenv.core.Env```).

mkdocstrings renders Google-style docstrings but leaves Sphinx roles as text. This extension rewrites
each role after the package has loaded:

* a role naming an object of a module the API reference renders becomes an autorefs link
  (``[Env][agentenv.core.Env]``), which a strict build fails on when the page does not exist;
* a role naming an object of the package that the reference does not render becomes code;
* a role naming something in the package that does not exist (a renamed or removed function) is a
  warning, so ``mkdocs build --strict`` fails: docstrings cannot point at names that are gone.

Roles naming other libraries (``:func:`torch.where```) become code. A name is looked up as written,
then in the scope of the documented object (its class, its module and what the module imports).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([\w.]+)(\(\))?`")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in the docstrings of one package.

    Args:
        documented: Modules the API reference renders (``["agentenv.core", ...]``): roles naming their
            public members become links.
    """

    def __init__(self, documented: list[str]) -> None:
        super().__init__()
        self.documented = tuple(documented)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Rewrite every docstring of ``pkg`` and its submodules (aliases are left to their targets)."""
        for obj in _walk(pkg):
            if obj.docstring is not None and self._rendered(obj.path):
                obj.docstring.value = ROLE.sub(lambda m, obj=obj: self._replace(obj, m), obj.docstring.value)

    def _replace(self, obj: griffe.Object, match: re.Match[str]) -> str:
        short, name, call = match.group(1), match.group(2), match.group(3) or ""
        shown = (name.rsplit(".", 1)[-1] if short else name) + call
        path, broken = _lookup(obj, name)
        if broken:
            griffe.logger.warning(f"{obj.path}: the docstring names `{name}`, which does not exist")
        if path is not None and self._rendered(path) and _documented(obj.modules_collection, path):
            return f"[`{shown}`][{path}]"
        return f"`{shown}`"

    def _rendered(self, path: str) -> bool:
        for module in self.documented:
            rest = path[len(module) + 1:] if path.startswith(module + ".") else None
            if rest is not None:
                return not any(part.startswith("_") for part in rest.split("."))
        return path in self.documented


def _walk(obj: griffe.Object):
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from _walk(member)


def _documented(collection: griffe.ModulesCollection, path: str) -> bool:
    """Whether mkdocstrings renders ``path`` with an anchor: it has a docstring of its own."""
    target = collection[path]
    return not target.is_alias and target.docstring is not None


def _exists(collection: griffe.ModulesCollection, path: str) -> bool:
    try:
        collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def _lookup(obj: griffe.Object, name: str) -> tuple[str | None, bool]:
    """``(full path, broken)`` of ``name`` as seen from ``obj``'s docstring.

    The path is None when it is unknown; ``broken`` says that the name should be in the package (a bare
    name, a name under the package, a member of one of its objects) but is not.
    """
    collection, package = obj.modules_collection, obj.package.name
    if _exists(collection, name):
        return name, False
    first, _, rest = name.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        try:
            base = scope.resolve(first)
        except griffe.NameResolutionError:
            scope = scope.parent
            continue
        path = f"{base}.{rest}" if rest else base
        if _exists(collection, path):
            return path, False
        inside = base == package or base.startswith(package + ".")
        return (None, True) if inside else (path, False)
    if not rest and obj.is_module:  # a module's docstring may name a member of one of its classes
        found = [c.members[name].path for c in obj.classes.values() if name in c.members]
        if len(found) == 1:
            return found[0], False
    return None, not rest or first == package
