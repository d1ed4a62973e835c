#!/usr/bin/env bash
# An OpenEnv server's own Python environment, .venv-openenv: openenv-core 0.3.0 and what it brings
# (gradio, fastmcp, huggingface-hub; about 475 MB), pinned by constraints-openenv.txt. The openenv/NAME
# adapter speaks the server's protocol and imports nothing of OpenEnv, so the trainer's environment
# never holds these packages; the adapter's tests start their server (tests/adapters/openenv_server.py)
# with this interpreter. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
source scripts/side_venv.sh
side_venv "$repo/.venv-openenv" "$repo/constraints-openenv.txt" "openenv-core==0.3.0"
"$repo/.venv-openenv/bin/python" -c "import openenv.core.env_server.http_server as s; print('OpenEnv server environment OK:', s.__name__)"
