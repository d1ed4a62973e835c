"""The ids ``agentenv envs`` lists for a peer, saved per installed version of the peer.

Listing a peer's ids imports the peer (seconds for reasoning-gym and TextArena), so the listing is
saved under ``$AGENTENV_CACHE/listing`` (:func:`agentenv.paths.cache_dir`) in a file named for its
key: the peer distribution's installed version, the Python version and a digest of agentenv's
adapter sources. Another version of any of them is another key, hence another file: a listing saved
for another version is never read. A file whose content does not hold its key is rebuilt; a peer
without distribution metadata, or a cache folder that cannot be written, is listed afresh each time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentenv.paths import cache_dir

FORMAT = 1
"""Layout of a listing file; part of the key."""


@dataclass(frozen=True)
class Row:
    """One listed id of a peer.

    Attributes:
        peer_id: The peer's own id (``"Wordle-v0"``); agentenv's id is the adapter's prefix + it.
        kwargs: The registry's keyword arguments for it (the adapter module's ``resolve``).
        needs: What it needs besides the package (:mod:`agentenv.adapters.needs`), checked when listed.
    """

    peer_id: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()


def key(name: str, distribution: str) -> dict[str, Any] | None:
    """The key of listing ``name`` (an adapter's prefix) of the peer ``distribution``; None when it has no metadata."""
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
    return {
        "format": FORMAT,
        "listing": name,
        "distribution": distribution,
        "version": version,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "adapters": adapters_digest(),
    }


def adapters_digest() -> str:
    """SHA-256 of agentenv's adapter sources (``agentenv/adapters/*.py``): they decide what is listed."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def listing_file(listing_key: Mapping[str, Any]) -> Path:
    """Where the listing of ``listing_key`` is saved: ``listing/<name>-<version>-<digest of the key>.json``.

    Raises:
        OSError: The cache folder cannot be created.
    """
    digest = hashlib.sha256(json.dumps(listing_key, sort_keys=True).encode()).hexdigest()[:16]
    name = f"{listing_key['listing']}-{listing_key['version']}-{digest}.json"
    return cache_dir("listing") / name.replace("/", "_").replace(os.sep, "_")


def rows(name: str, distribution: str, build: Callable[[], list[Row]]) -> list[Row]:
    """Listing ``name`` of the peer ``distribution``: the one saved under its current key, else ``build()``, saved."""
    listing_key = key(name, distribution)
    if listing_key is None:
        return build()
    try:
        path = listing_file(listing_key)
    except OSError:
        return build()
    saved = read(path, listing_key)
    if saved is not None:
        return saved
    built = build()
    write(path, listing_key, built)
    return built


def read(path: Path, listing_key: Mapping[str, Any]) -> list[Row] | None:
    """The rows saved in ``path`` under ``listing_key``; None when missing, unreadable or saved under another key."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved["key"] != listing_key:
            return None
        return [Row(r["peer_id"], dict(r["kwargs"]), tuple(r["needs"])) for r in saved["rows"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def write(path: Path, listing_key: Mapping[str, Any], listed: list[Row]) -> None:
    """Save ``listed`` under ``listing_key`` in ``path`` atomically; a folder that cannot be written is skipped."""
    body = {
        "key": dict(listing_key),
        "rows": [{"peer_id": r.peer_id, "kwargs": dict(r.kwargs), "needs": list(r.needs)} for r in listed],
    }
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(body, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
