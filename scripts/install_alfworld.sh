#!/usr/bin/env bash
# Install the ALFWorld game engine: alfworld (PyPI) and its only required dependency, textworld[pddl]
# (which builds fast-downward-textworld and jericho from source: about 5 minutes on 2 cores).
# alfworld 0.4.2 requires nothing else (torch, transformers, ai2thor, ... are only in its [full]/[vis]
# extras, which we do not install), so it leaves torch and transformers as they are; checked below.
# textworld is pinned to 1.7.0 because envs/alfworld/game.py reuses textworld 1.7's PddlEnv.reset body.
#
# fast-downward-textworld's build runs `python build.py` in a subprocess: the venv's bin/ is first on
# PATH (below), so that `python` is the venv's interpreter and not a pyenv shim or /usr/bin/python3
# (with a pyenv shim first the build died with "No module named 'glob'").
#
#   bash scripts/install_alfworld.sh      # uses ${PY:-.venv/bin/python} -m pip; idempotent
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

if "$PY" -c "import alfworld, textworld, fast_downward; assert textworld.__version__ == '1.7.0'" 2>/dev/null; then
  echo "alfworld already installed"
  exit 0
fi
before=$("$PY" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>/dev/null || echo none)
# Build tools for the two source builds (fast-downward-textworld: cmake + a C++ compiler; jericho: make + cc).
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null || ! command -v make >/dev/null; then
  if command -v apt-get >/dev/null; then
    echo "install_alfworld: apt-get install build-essential cmake" >&2
    flock /tmp/apt.lock apt-get update -qq
    DEBIAN_FRONTEND=noninteractive flock /tmp/apt.lock apt-get install -y -qq build-essential cmake >/dev/null
  fi
fi
pip_install -q "alfworld==0.4.2" "textworld[pddl]==1.7.0"
after=$("$PY" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>/dev/null || echo none)
if [ "$before" != "$after" ]; then
  echo "install_alfworld.sh: torch/transformers changed ($before -> $after)" >&2
  exit 1
fi
"$PY" -c "import alfworld.agents.environment.alfred_tw_env, textworld.envs.pddl; print('alfworld ok')"
