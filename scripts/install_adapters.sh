#!/usr/bin/env bash
# Peers' environments (agentenv/adapters/): the packages behind the `gem`, `textarena` and `skyrl`
# extras of pyproject.toml (keep the lists the same), and the OpenEnv client's websockets (`openenv`),
# pinned by constraints.txt. Gymnasium and
# reasoning-gym, the other adapters' peers, come with the core install. gem-llm and textarena are small
# and pure Python (about 3 MB with nltk and chess); skyrl-gym brings pandas and omegaconf. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

pip_install -q "gem-llm>=0.0.3,<0.1" "textarena>=0.7.4,<0.8" "skyrl-gym>=0.4,<0.5" "websockets>=13"

"$PY" - <<'PY'
import importlib.metadata as md
import importlib.util

peers = (("gem", "gem-llm"), ("textarena", "textarena"), ("skyrl_gym", "skyrl-gym"), ("websockets", "websockets"))
for module, dist in peers:
    assert importlib.util.find_spec(module), f"{dist} is missing"
print("adapters' peers OK (" + ", ".join(f"{d} {md.version(d)}" for _, d in peers) + ")")
PY
