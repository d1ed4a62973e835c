#!/usr/bin/env bash
# A verifiers environment's own Python environment, .venv-verifiers: verifiers 0.3.1 (the last release
# whose `import verifiers as vf` is the classic API the hub's environments are written against: 0.4.0
# ships only verifiers.v1) and what it brings (datasets, openai, anthropic, mcp, ...; about 100
# packages), pinned by constraints-verifiers.txt. The verifiers/NAME adapter runs
# agentenv/adapters/verifiers_runner.py under this interpreter and imports nothing of verifiers, so the
# trainer's environment never holds these packages. A user's own environments are installed here (pip
# install, or prime env install) or in a venv of their own (env.kwargs.python). Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
source scripts/side_venv.sh
side_venv "$repo/.venv-verifiers" "$repo/constraints-verifiers.txt" "verifiers==0.3.1"
"$repo/.venv-verifiers/bin/python" -c "import verifiers as vf; vf.ToolEnv; print('verifiers environment OK:', vf.__version__)"
