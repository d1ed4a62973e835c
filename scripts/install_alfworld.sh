#!/usr/bin/env bash
# Install the ALFWorld game engine: alfworld (PyPI) and its only required dependency, textworld[pddl]
# (which builds fast-downward-textworld and jericho from source: about 5 minutes on 2 cores).
# alfworld 0.4.2 requires nothing else (torch, transformers, ai2thor, ... are only in its [full]/[vis]
# extras, which we do not install), so it leaves torch and transformers as they are; checked below.
# textworld is pinned to 1.7.0 because envs/alfworld/game.py reuses textworld 1.7's PddlEnv.reset body.
#
#   bash scripts/install_alfworld.sh      # uses ${PIP:-.venv/bin/pip}; idempotent
set -euo pipefail
cd "$(dirname "$0")/.."
PIP=${PIP:-.venv/bin/pip}
PY=${PY:-.venv/bin/python}

if $PY -c "import alfworld, textworld, fast_downward; assert textworld.__version__ == '1.7.0'" 2>/dev/null; then
  echo "alfworld already installed"
  exit 0
fi
before=$($PY -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>/dev/null || echo none)
# Build tools for the two source builds (fast-downward-textworld: cmake + a C++ compiler; jericho: make + cc).
if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then
  if command -v apt-get >/dev/null; then
    apt-get update -qq && apt-get install -y -qq build-essential cmake >/dev/null
  fi
fi
$PIP install -q "alfworld==0.4.2" "textworld[pddl]==1.7.0"
after=$($PY -c 'import torch, transformers; print(torch.__version__, transformers.__version__)' 2>/dev/null || echo none)
if [ "$before" != "$after" ]; then
  echo "install_alfworld.sh: torch/transformers changed ($before -> $after)" >&2
  exit 1
fi
$PY -c "import alfworld.agents.environment.alfred_tw_env, textworld.envs.pddl; print('alfworld ok')"
