"""Starting the OpenEnv test servers (openenv_server.py) under the OpenEnv server's own interpreter.

Used by the adapter's tests and by benchmarks/bench_adapters.py; imports nothing of OpenEnv.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SERVER = Path(__file__).with_name("openenv_server.py")
PYTHON = Path(os.environ.get("AGENTENV_OPENENV_PYTHON", REPO / ".venv-openenv" / "bin" / "python"))
"""The OpenEnv server environment's interpreter (scripts/install_openenv.sh; ``$AGENTENV_OPENENV_PYTHON`` overrides)."""


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(kinds: tuple[str, ...], timeout_s: float = 90.0) -> tuple[list[subprocess.Popen], dict[str, str]]:
    """Start one server per kind (``guess``, ``echo``) and wait until each answers ``/health``.

    Returns:
        The processes (terminate them) and ``{kind: "http://127.0.0.1:PORT"}``.

    Raises:
        FileNotFoundError: :data:`PYTHON` does not exist.
        RuntimeError: A server exited, or did not answer within ``timeout_s`` seconds (the others are stopped).
    """
    if not PYTHON.is_file():
        raise FileNotFoundError(f"no OpenEnv server environment at {PYTHON} (bash scripts/install_openenv.sh)")
    procs: list[subprocess.Popen] = []
    urls: dict[str, str] = {}
    try:
        for kind in kinds:
            port = free_port()
            procs.append(subprocess.Popen([str(PYTHON), str(SERVER), kind, str(port)], stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE))
            urls[kind] = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout_s
        for (kind, url), proc in zip(urls.items(), procs, strict=True):
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"the {kind} server exited: {proc.stderr.read().decode()[-2000:]}")
                try:
                    if httpx.get(url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {kind} server did not answer /health within {timeout_s:g} s")
                time.sleep(0.2)
    except BaseException:
        stop(procs)
        raise
    return procs, urls


def stop(procs: list[subprocess.Popen]) -> None:
    """Terminate the servers and wait for them (20 s each at most)."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
