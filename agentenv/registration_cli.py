"""``agentenv envs``: list the registered environments (built-ins and plugins)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from agentenv.registration import load_plugins, registry


def list_envs_main(argv: Sequence[str] | None = None) -> int:
    """Print each registered id with its description, one a line; return the exit status (0).

    Installed peers' environments (:mod:`agentenv.adapters`) are listed too, from the listing saved
    for each peer's installed version (the first listing after an install or upgrade imports the
    peer), and id patterns (``gym/<ID>``) after them. A peer's environment that cannot be built on
    this machine ends with ``(unavailable: WHAT IT NEEDS)``, e.g. ``needs NLTK data 'words': python -m
    nltk.downloader words``.

    Args:
        argv: Command-line arguments after ``envs`` (``--json`` prints a JSON list instead; each
            environment's ``unavailable`` is that text, or null).
    """
    parser = argparse.ArgumentParser(prog="agentenv envs", description="List the registered environments.")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON list of {id, entry_point, description, unavailable}"
    )
    args = parser.parse_args(list(argv) if argv is not None else None)
    load_plugins()
    from agentenv.adapters import PATTERNS, installed_specs, unavailable

    peers = {s.id: s for s in installed_specs() if s.id not in registry}  # installed peers' environments
    specs = sorted([*registry.values(), *peers.values()], key=lambda s: s.id)
    missing = {i: reason for i, reason in unavailable().items() if i in peers}
    if args.json:
        import json

        rows = [
            {
                "id": s.id,
                "entry_point": s.entry_point if isinstance(s.entry_point, str) else repr(s.entry_point),
                "description": s.description,
                "unavailable": missing.get(s.id),
            }
            for s in specs
        ] + [{"id": p, "entry_point": None, "description": d, "pattern": True} for p, d in PATTERNS]
        print(json.dumps(rows, indent=2))
        return 0
    width = max((len(s.id) for s in specs), default=0)
    for s in specs:
        note = f" (unavailable: {missing[s.id]})" if s.id in missing else ""
        print(f"{s.id:<{width}}  {s.description}{note}")
    for pattern, description in PATTERNS:
        print(f"{pattern:<{width}}  {description}")
    summary = f"{len(specs)} environments, {len(missing)} of them unavailable here"
    print(f"({summary}, and the patterns {', '.join(p for p, _ in PATTERNS)})", file=sys.stderr)
    return 0
