#!/usr/bin/env bash
# Install what the sandboxes need (Debian docker.io, debootstrap, bubblewrap), start a private dockerd
# in the background, and build the sandbox image unless it is already there.
#
# Use it as `source scripts/install_docker.sh` (DOCKER_HOST is then exported into your shell) or run it
# and then `export DOCKER_HOST=$(cat "${AGENTENV_DOCKER_DIR:-...}/docker_host")`; the last line printed
# is `DOCKER_HOST=unix://...`. Idempotent: a second run finds the daemon answering and the image built.
#
# Environment:
#   AGENTENV_DOCKER_DIR   data root of the daemon (default /var/cache/agentenv-docker when writable,
#                         else $HOME/.cache/agentenv-docker); keep it between CI runs to keep images.
#   AGENTENV_CACHE        agentenv's cache (default ~/.cache/agentenv); holds the debootstrap tarball.
#   PYTHON                the Python that has agentenv installed (default .venv/bin/python).
#   AGENTENV_SKIP_IMAGE=1 start the daemon only.

_agentenv_install_docker() {
    local -  # shell options set here stay here when the script is sourced
    set -u
    local here repo py root exec_root sock log pidfile i drv
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    repo="$(dirname "$here")"
    py="${PYTHON:-$repo/.venv/bin/python}"
    [ -x "$py" ] || py="$(command -v python3)"

    # 1. Debian packages (docker.io brings dockerd, containerd and runc).
    local need=()
    command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
    command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
    command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
    # the same libraries as the Docker image, for the bwrap and process backends (system python3)
    local p
    for p in python3 python3-numpy python3-sympy; do
        dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
    done
    if [ "${#need[@]}" -gt 0 ]; then
        echo "install_docker: apt-get install ${need[*]}" >&2
        flock /tmp/apt.lock apt-get update -qq >&2 || return 1
        DEBIAN_FRONTEND=noninteractive flock /tmp/apt.lock \
            apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 || return 1
    fi

    # 2. A private daemon: own data root, exec root and socket; no iptables, no bridge.
    if [ -n "${AGENTENV_DOCKER_DIR:-}" ]; then root="$AGENTENV_DOCKER_DIR"
    elif mkdir -p /var/cache/agentenv-docker 2>/dev/null && [ -w /var/cache/agentenv-docker ]; then
        root=/var/cache/agentenv-docker
    else root="$HOME/.cache/agentenv-docker"; fi
    mkdir -p "$root/data"
    exec_root=/run/agentenv-docker  # short path: the unix socket path limit is 108 bytes
    mkdir -p "$exec_root" 2>/dev/null || exec_root="${TMPDIR:-/tmp}/agentenv-docker-exec"
    mkdir -p "$exec_root"
    sock="$exec_root/docker.sock"
    log="$root/dockerd.log"
    pidfile="$exec_root/dockerd.pid"
    export DOCKER_HOST="unix://$sock"
    echo "$DOCKER_HOST" > "$root/docker_host"

    _agentenv_ping() { "$py" -c 'import docker,sys; docker.from_env(timeout=5).ping()' >/dev/null 2>&1; }

    local setsid=""
    command -v setsid >/dev/null 2>&1 && setsid=setsid
    if ! _agentenv_ping; then
        for drv in overlay2 vfs; do
            # a daemon of ours that does not answer (checked by name: the pid may have been reused)
            if [ -f "$pidfile" ] && [ "$(cat "/proc/$(cat "$pidfile")/comm" 2>/dev/null)" = dockerd ]; then
                kill "$(cat "$pidfile")" 2>/dev/null; sleep 2
            fi
            rm -f "$sock" "$pidfile"
            echo "install_docker: starting dockerd (storage $drv, data root $root/data)" >&2
            # setsid: the daemon is shared machine-wide (one exec root, one socket; a second checkout
            # finds it answering and reuses it), so it must not die with this shell's process group
            # (Ctrl-C, or a `timeout` that ends the install).
            $setsid nohup dockerd --data-root "$root/data" --exec-root "$exec_root" -H "$DOCKER_HOST" \
                --pidfile "$pidfile" --iptables=false --ip6tables=false --bridge=none \
                --storage-driver "$drv" >>"$log" 2>&1 </dev/null &
            for i in $(seq 1 60); do  # bounded: 30 s
                _agentenv_ping && break
                sleep 0.5
            done
            if _agentenv_ping; then break; fi
            echo "install_docker: dockerd with $drv did not answer; last log lines:" >&2
            tail -n 5 "$log" >&2
        done
        _agentenv_ping || { echo "install_docker: dockerd failed to start (see $log)" >&2; return 1; }
    fi
    echo "install_docker: dockerd answers at $DOCKER_HOST" >&2
    # Containers left by an earlier, killed run (label set by sandboxes/docker_backend.py). The daemon
    # is shared by every checkout and run on this machine, so only containers that stopped (or were
    # never started) over 10 minutes ago go: a running one, or one whose exit its owner is still
    # inspecting (OOM diagnosis), belongs to a live run.
    "$py" -c 'import datetime as dt, docker
c = docker.from_env()
now = dt.datetime.now(dt.timezone.utc)
def age(stamp):
    try:
        return (now - dt.datetime.fromisoformat(stamp[:19] + "+00:00")).total_seconds()
    except Exception:
        return 0.0
for k in c.containers.list(all=True, filters={"label": "agentenv.sandbox"}):
    st = k.attrs.get("State", {})
    if st.get("Status") in ("exited", "dead") and age(st.get("FinishedAt", "")) > 600:
        k.remove(force=True)
    elif st.get("Status") == "created" and age(k.attrs.get("Created", "")) > 600:
        k.remove(force=True)' >&2 || true

    # 3. The sandbox image (debootstrap tarball cached under $AGENTENV_CACHE).
    if [ "${AGENTENV_SKIP_IMAGE:-0}" != 1 ]; then
        (cd "$repo" && "$py" -m agentenv.sandboxes.cli build-image) >&2 || return 1
    fi
    echo "DOCKER_HOST=$DOCKER_HOST"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -eo pipefail
    _agentenv_install_docker
else
    _agentenv_install_docker
fi
