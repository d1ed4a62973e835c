"""Where agentenv reads shared data and writes its caches.

Data (read-only): ``$AGENTENV_DATA``, else ``../shared/data`` beside the repository checkout, else
``../shared/data`` beside the current directory. Cache (writable): ``$AGENTENV_CACHE``, else
``~/.cache/agentenv``. Nothing here writes to the data folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentenv.errors import DataError

_REPO = Path(__file__).resolve().parents[1]


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """Return the shared data folder.

    Args:
        override: An explicit folder (an env's ``data_root`` argument); wins over everything else.

    Raises:
        DataError: No candidate folder exists; the message names the ones tried.
    """
    candidates = [Path(override)] if override else []
    if os.environ.get("AGENTENV_DATA"):
        candidates.append(Path(os.environ["AGENTENV_DATA"]))
    candidates += [_REPO.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    tried = ", ".join(str(c) for c in candidates)
    raise DataError(f"shared data folder not found (tried {tried}); set AGENTENV_DATA=PATH, or pass the env's "
                    "data_root: agentenv train env.kwargs.data_root=PATH, agentenv eval --data-root PATH")


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``$AGENTENV_CACHE/<parts>`` (default ``~/.cache/agentenv``)."""
    root = Path(os.environ.get("AGENTENV_CACHE", Path.home() / ".cache" / "agentenv"))
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
