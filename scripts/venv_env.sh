# Sourced by the install_*.sh scripts (not run on its own): the venv's interpreter and the pins.
#
# Sets PY to the venv's python (PY=... chooses another; a PIP=.../bin/pip is read as its python), never
# the `python` on PATH, and puts its bin/ first on PATH, so a source build that spawns `python`
# (fast-downward-textworld's build.py) gets it too. Exports PIP_CONSTRAINT=constraints.txt
# (AGENTENV_CONSTRAINTS=... chooses another) and defines pip_install, which passes it to pip.
# Expects `repo` (the repository root) to be set by the caller.
if [ -z "${PY:-}" ] && [ -n "${PIP:-}" ]; then PY="$(dirname "$PIP")/python"; fi
PY="${PY:-$repo/.venv/bin/python}"
[ -x "$PY" ] || { echo "$(basename "$0"): $PY not found; run bash scripts/install.sh first" >&2; exit 1; }
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PATH="$(dirname "$PY"):$PATH"
CONSTRAINTS="${AGENTENV_CONSTRAINTS:-$repo/constraints.txt}"
export PIP_CONSTRAINT="$CONSTRAINTS"
pip_install() { "$PY" -m pip install -c "$CONSTRAINTS" "$@"; }
