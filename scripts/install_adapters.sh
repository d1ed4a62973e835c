#!/usr/bin/env bash
# Peers' environments (agentenv/adapters/): the packages behind the `gem` and `textarena` extras of
# pyproject.toml (keep the two lists the same), pinned by constraints.txt. Gymnasium and reasoning-gym,
# the other adapters' peers, come with the core install. Small and pure Python (about 3 MB with nltk
# and chess); about 20 s on a cold cache. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

pip_install -q "gem-llm>=0.0.3,<0.1" "textarena>=0.7.4,<0.8"

"$PY" - <<'PY'
import importlib.metadata as md
import importlib.util

for module, dist in (("gem", "gem-llm"), ("textarena", "textarena")):
    assert importlib.util.find_spec(module), f"{dist} is missing"
print("adapters' peers OK (" + ", ".join(f"{d} {md.version(d)}" for d in ("gem-llm", "textarena")) + ")")
PY
