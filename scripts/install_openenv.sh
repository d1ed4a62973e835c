#!/usr/bin/env bash
# An OpenEnv server's own Python environment, .venv-openenv: openenv-core 0.3.0 and what it brings
# (gradio, fastmcp, huggingface-hub; about 475 MB), pinned by constraints-openenv.txt. The openenv/NAME
# adapter speaks the server's protocol and imports nothing of OpenEnv, so the trainer's environment
# never holds these packages; the adapter's tests start their server (tests/adapters/openenv_server.py)
# with this interpreter. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
venv="$repo/.venv-openenv"
if [ ! -x "$venv/bin/python" ]; then
  # the trainer venv's base interpreter (the same Python), else python3 on PATH
  base="$("$repo/.venv/bin/python" -c 'import sys; print(sys._base_executable)' 2>/dev/null || command -v python3)"
  "$base" -m venv "$venv"
fi
# its own pins only (a PIP_CONSTRAINT exported by the trainer's install scripts names constraints.txt)
PIP_CONSTRAINT="$repo/constraints-openenv.txt" "$venv/bin/python" -m pip install -q "openenv-core==0.3.0"
"$venv/bin/python" -c "import openenv.core.env_server.http_server as s; print('OpenEnv server environment OK:', s.__name__)"
