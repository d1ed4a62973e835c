"""``agentenv sandbox ...``: build the Docker image, show which backend ``auto`` picks.

Usage:
    agentenv sandbox build-image [--force]
    agentenv sandbox info [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from agentenv.errors import SandboxError


def main(argv: list[str] | None = None) -> int:
    """Run the ``sandbox`` subcommand; return the process exit code (0 ok, 1 failure, 2 usage)."""
    parser = argparse.ArgumentParser(prog="agentenv sandbox", description="Sandbox tools.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    build = sub.add_parser("build-image", help="debootstrap + docker import the sandbox image (no registry)")
    build.add_argument("--force", action="store_true", help="rebuild the rootfs and re-import")
    info = sub.add_parser("info", help="which backend 'auto' picks and how isolated it is")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "build-image":
            from agentenv.sandboxes.image import build_image

            print(build_image(force=args.force, log=lambda m: print(m, file=sys.stderr, flush=True)))
            return 0
        from agentenv.sandboxes.select import backend_report

        report = backend_report()
        if args.json:
            print(json.dumps(report, indent=2))
        else:
            for key, value in report.items():
                print(f"{key}: {value}")
        return 0
    except SandboxError as e:
        print(f"agentenv sandbox: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
