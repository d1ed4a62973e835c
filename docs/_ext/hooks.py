"""MkDocs hook: let the API reference find the modules the package maps from other folders.

``pyproject.toml`` installs ``trainer/`` as ``agentenv.trainer`` (and ``envs/``, ``sandboxes/`` likewise)
with setuptools' ``package-dir``. Griffe, which reads the sources for mkdocstrings, looks for
``agentenv/trainer/``; this hook builds a temporary tree of symbolic links shaped like the installed
package and puts it first on the Python handler's search path.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

PACKAGE = "agentenv"


def package_tree(repo: Path, into: Path, package: str = PACKAGE) -> Path:
    """Link ``repo``'s folders into ``into/<package>`` as ``package-dir`` maps them; return ``into``.

    Args:
        repo: The repository root (holds ``pyproject.toml``).
        into: An empty folder.
        package: The top-level package.

    Raises:
        KeyError: ``pyproject.toml`` maps no folder to ``package``.
    """
    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    root = into / package
    root.mkdir()
    for entry in (repo / mapping[package]).iterdir():
        if entry.name == "__init__.py":  # a copy: Griffe scans the folder of the resolved __init__.py
            shutil.copy(entry, root / entry.name)
        else:
            (root / entry.name).symlink_to(entry)
    for name, folder in mapping.items():
        prefix, _, sub = name.partition(".")
        if prefix == package and sub and "." not in sub and not (root / sub).exists():
            (root / sub).symlink_to(repo / folder)
    return into


@event_priority(100)  # before mkdocstrings reads its handlers' options
def on_config(config):
    """Point the mkdocstrings Python handler at the linked tree (removed when the build exits)."""
    tmp = Path(tempfile.mkdtemp(prefix="agentenv-docs-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    tree = package_tree(Path(config.config_file_path).parent, tmp)
    python = config.plugins["mkdocstrings"].config.handlers.setdefault("python", {})
    python["paths"] = [str(tree), *python.get("paths", [])]
    return config
