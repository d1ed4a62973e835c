"""The docs build's two extensions (docs/_ext): the package tree for Griffe, and the Sphinx-role check."""

from __future__ import annotations

import importlib.util
import logging
import sys
from pathlib import Path

import griffe
import pytest

EXT = Path(__file__).resolve().parents[2] / "docs" / "_ext"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"docs_ext_{name}", EXT / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_package_tree_places_mapped_folders_inside_the_package(tmp_path):
    repo = tmp_path / "repo"
    write(repo / "pyproject.toml", '[tool.setuptools]\npackage-dir = { "toy" = "src", '
          '"toy.trainer" = "trainer", "toy.trainer.sub" = "elsewhere" }\n')
    write(repo / "src" / "__init__.py", '"""Top."""\n')
    write(repo / "src" / "core.py", '"""Core."""\n')
    write(repo / "trainer" / "__init__.py", "")
    write(repo / "trainer" / "config.py", '"""Config."""\n')
    (tmp_path / "tree").mkdir()
    tree = load("hooks").package_tree(repo, tmp_path / "tree", "toy")
    root = tree / "toy"
    assert sorted(p.name for p in root.iterdir()) == ["__init__.py", "core.py", "trainer"]
    assert not (root / "__init__.py").is_symlink() and (root / "__init__.py").read_text() == '"""Top."""\n'
    assert (root / "trainer" / "config.py").resolve() == (repo / "trainer" / "config.py").resolve()
    package = griffe.load("toy", search_paths=[str(tree)])
    assert package["trainer.config"].docstring.value == "Config."


@pytest.fixture()
def package(tmp_path):
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "a.py", '''"""Module a: see :meth:`run`."""

import torch

from pkg.b import Other


class Thing:
    """A thing; made by :func:`~pkg.a.maker`, compared with :class:`Other` and :func:`torch.where`."""

    def run(self):
        """Run; then :meth:`stop` and :func:`gone`."""

    def stop(self):
        """Stop."""


def maker():
    """Make a :class:`Thing`; see :func:`_private` and :data:`LIMIT`."""


def _private():
    """Hidden."""


LIMIT = 3
''')
    write(tmp_path / "pkg" / "b.py", '''"""Module b: names :func:`nothing_here`, unchecked."""


class Other:
    """Other."""
''')
    return tmp_path


def test_roles_become_links_code_or_a_warning(package, caplog):
    roles = load("sphinx_roles").SphinxRoles(documented=["pkg.a"])
    with caplog.at_level(logging.WARNING):
        pkg = griffe.load("pkg", search_paths=[str(package)], extensions=griffe.load_extensions(roles))
    a = pkg["a"]
    assert a.docstring.value == "Module a: see [`run`][pkg.a.Thing.run]."
    assert a["Thing"].docstring.value == (
        "A thing; made by [`maker`][pkg.a.maker], compared with `Other` and `torch.where`."
    )
    assert a["Thing.run"].docstring.value == "Run; then [`stop`][pkg.a.Thing.stop] and `gone`."
    assert a["maker"].docstring.value == "Make a [`Thing`][pkg.a.Thing]; see `_private` and `LIMIT`."
    assert pkg["b"].docstring.value == "Module b: names :func:`nothing_here`, unchecked."
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["pkg.a.Thing.run: the docstring names `gone`, which does not exist"]
