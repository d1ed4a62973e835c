#!/usr/bin/env bash
# Install the distributed learner's stack: DeepSpeed (no compiled ops), Ray (core only) and OpenRLHF
# 0.11.2 without its dependency list (it pins flash-attn, which cannot build without CUDA, and
# transformers==5.15, which we must not touch), plus the light pure-Python packages that the OpenRLHF
# modules we import need (peft, torchdata, einops, pylatexenc; hjson/msgpack/ninja/py-cpuinfo/pydantic/psutil come
# with DeepSpeed).
#
# torch and transformers are never installed, upgraded or downgraded: a constraints file pins them to
# the versions already present.
#
# Idempotent: packages already at the pinned versions are left alone. Works without a pip cache.
#
# Environment:
#   PY    the venv's python (default .venv/bin/python; PIP=.../bin/pip is read as its python).
#   AGENTENV_CONSTRAINTS  the pins (default constraints.txt), passed with -c on top of the ones below.
#   PIP_LOCK  a lock file to serialise concurrent installs (default /tmp/pip.lock; set empty to skip).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
# The venv's interpreter first on PATH, never the `python` on PATH; pins: constraints.txt.
source "$repo/scripts/venv_env.sh"
PIP_LOCK="${PIP_LOCK-/tmp/pip.lock}"
py="$PY"

DEEPSPEED_VERSION=0.19.6
RAY_VERSION=2.55.0
OPENRLHF_VERSION=0.11.2

pip_locked() {  # pip_locked install ARGS...: the venv's pip with the pins, under $PIP_LOCK
    if [ -n "$PIP_LOCK" ] && command -v flock >/dev/null 2>&1; then
        flock "$PIP_LOCK" "$PY" -m pip "$1" -c "$CONSTRAINTS" "${@:2}"
    else
        "$PY" -m pip "$1" -c "$CONSTRAINTS" "${@:2}"
    fi
}

# Pin what is already installed so that no dependency resolution can move it (constraints.txt pins the
# same versions when the venv was installed with it; a venv that differs fails loudly here, not silently).
constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
"$py" - >"$constraints" <<'EOF'
import importlib.metadata as md
for name in ("torch", "transformers", "numpy", "accelerate", "tokenizers", "safetensors"):
    try:
        print(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        pass
EOF
echo "install_openrlhf: constraints: $(tr '\n' ' ' <"$constraints")" >&2

have() {  # have NAME VERSION -> 0 when exactly that version is installed
    "$py" -c "import importlib.metadata as m,sys; sys.exit(0 if m.version('$1')=='$2' else 1)" 2>/dev/null
}

need=()
have deepspeed "$DEEPSPEED_VERSION" || need+=("deepspeed==$DEEPSPEED_VERSION")
have ray "$RAY_VERSION" || need+=("ray==$RAY_VERSION")
for pkg in peft torchdata einops pylatexenc; do
    "$py" -c "import importlib.metadata as m; m.version('$pkg')" 2>/dev/null || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "install_openrlhf: pip install ${need[*]}" >&2
    # DS_BUILD_OPS=0: DeepSpeed compiles no C++/CUDA op at install time (JIT on demand, never on CPU here).
    DS_BUILD_OPS=0 DS_BUILD_AIO=0 DS_BUILD_SPARSE_ATTN=0 \
        pip_locked install -q -c "$constraints" "${need[@]}"
fi

if ! have openrlhf "$OPENRLHF_VERSION"; then
    echo "install_openrlhf: pip install --no-deps openrlhf==$OPENRLHF_VERSION" >&2
    pip_locked install -q --no-deps "openrlhf==$OPENRLHF_VERSION"
fi

# OpenRLHF's wheel also ships a top-level `tests` package into site-packages, which can shadow a
# project's own `tests` folder. Remove it only when OpenRLHF's RECORD lists it as its own file.
"$py" - <<'EOF'
import importlib.metadata as md, pathlib, shutil
dist = md.distribution("openrlhf")
owned = {str(f) for f in (dist.files or []) if str(f).startswith("tests/")}
if owned:
    site = pathlib.Path(dist.locate_file("tests"))
    init = site / "__init__.py"
    if init.is_file() and "tests/__init__.py" in owned:
        others = [p for p in site.rglob("*.py") if str(p.relative_to(site.parent)) not in owned]
        if not others:
            shutil.rmtree(site)
            print(f"install_openrlhf: removed OpenRLHF's stray top-level package {site}")
EOF

"$py" - <<'EOF'
import importlib.metadata as md
for n in ("torch", "transformers", "deepspeed", "ray", "openrlhf", "peft", "torchdata"):
    print(f"install_openrlhf: {n} {md.version(n)}")
EOF
