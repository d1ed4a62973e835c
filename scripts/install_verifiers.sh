#!/usr/bin/env bash
# A verifiers environment's own Python environment, .venv-verifiers: verifiers 0.3.1 and what it brings
# (datasets, openai, anthropic, mcp, ...), pinned by constraints-verifiers.txt. The verifiers/NAME adapter
# runs agentenv/adapters/verifiers_runner.py under this interpreter and imports nothing of verifiers, so
# the trainer's environment never holds these packages. A user's own environments are installed here
# (pip install, or prime env install) or in a venv of their own (env.kwargs.python). Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$repo/.venv-verifiers"
if [ ! -x "$venv/bin/python" ]; then
  # the trainer venv's base interpreter (the same Python), else python3 on PATH
  base="$("$repo/.venv/bin/python" -c 'import sys; print(sys._base_executable)' 2>/dev/null || command -v python3)"
  "$base" -m venv "$venv"
fi
# its own pins only (a PIP_CONSTRAINT exported by the trainer's install scripts names constraints.txt)
PIP_CONSTRAINT="$repo/constraints-verifiers.txt" "$venv/bin/python" -m pip install -q "verifiers==0.3.1"
"$venv/bin/python" -c "import verifiers as vf; vf.ToolEnv; print('verifiers environment OK:', vf.__version__)"
