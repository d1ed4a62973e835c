#!/usr/bin/env bash
# Install what the trajectory pool, staleness control and pipeline simulator need (idempotent).
# numpy: the pool's vectorised decisions; tyro: the `agentenv simulate` command line.
set -euo pipefail
PIP=${PIP:-.venv/bin/pip}
$PIP install -q "numpy>=1.24" "tyro>=0.8"
