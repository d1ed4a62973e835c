# Sourced by the install scripts of a peer's own Python environment (install_openenv.sh,
# install_verifiers.sh; not run on its own): side_venv DIR CONSTRAINTS PACKAGE... makes the venv DIR
# (with the trainer venv's base interpreter, the same Python, else python3 on PATH) if it is missing,
# and installs PACKAGE... into it under CONSTRAINTS alone (a PIP_CONSTRAINT exported by the trainer's
# install scripts names constraints.txt, whose pins are not this environment's). Expects `repo` set.
side_venv() {
  local venv="$1" pins="$2"
  shift 2
  if [ ! -x "$venv/bin/python" ]; then
    local base
    base="$("$repo/.venv/bin/python" -c 'import sys; print(sys._base_executable)' 2>/dev/null || command -v python3)"
    "$base" -m venv "$venv"
  fi
  PIP_CONSTRAINT="$pins" "$venv/bin/python" -m pip install -q "$@"
}
