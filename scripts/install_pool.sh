#!/usr/bin/env bash
# Install what the trajectory pool, staleness control and pipeline simulator need (idempotent).
# numpy: the pool's vectorised decisions; tyro: the `agentenv simulate` command line.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

pip_install -q "numpy>=1.24" "tyro>=0.8"
