#!/usr/bin/env bash
# Install what the trajectory pool, staleness control and pipeline simulator need (idempotent).
# numpy: the pool's vectorised decisions; tyro: the `agentenv simulate` command line.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter (PY=...; a PIP=.../bin/pip is read as its python), never the `python` on PATH;
# its bin/ goes first on PATH so that a build that spawns `python` gets it too. Pins: constraints.txt.
if [ -z "${PY:-}" ] && [ -n "${PIP:-}" ]; then PY="$(dirname "$PIP")/python"; fi
PY="${PY:-$repo/.venv/bin/python}"
[ -x "$PY" ] || { echo "$(basename "$0"): $PY not found; run bash scripts/install.sh first" >&2; exit 1; }
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PATH="$(dirname "$PY"):$PATH"
CONSTRAINTS="${AGENTENV_CONSTRAINTS:-$repo/constraints.txt}"
export PIP_CONSTRAINT="$CONSTRAINTS"
pip_install() { "$PY" -m pip install -c "$CONSTRAINTS" "$@"; }

pip_install -q "numpy>=1.24" "tyro>=0.8"
