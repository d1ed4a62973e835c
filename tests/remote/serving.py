"""Start a real ``agentenv serve`` process on loopback for the remote tests (bounded waits only).

The served env is the example plugin (``examples/guess_number``), registered in the server process
as its entry point would be, then the real ``agentenv serve`` command runs (``agentenv.cli.main``).
``--port 0`` lets the OS pick a free port; the server prints the bound URL on its first line.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GUESS_NUMBER_ID = "examples/GuessNumber-v0"

_LAUNCH = (
    "import sys, agentenv_guess_number; agentenv_guess_number.register_envs(); "
    "from agentenv.cli import main; sys.exit(main(['serve', *sys.argv[1:]]))"
)


class Server:
    """A running ``agentenv serve`` child: ``url``, ``proc``, :meth:`kill`, :meth:`stop`."""

    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    @property
    def pid(self) -> int:
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: the server dies at once, with sessions open (a crash)."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM, then SIGKILL after 10 s; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


def launch(*args: str, env_id: str = GUESS_NUMBER_ID, extra_env: dict[str, str] | None = None,
           startup_s: float = 30.0) -> subprocess.Popen:
    """The server process (``python -c ... serve ENV_ID --port 0 ARGS``), not yet waited for."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "examples" / "guess_number"), str(REPO)]),
           **(extra_env or {})}
    return subprocess.Popen([sys.executable, "-c", _LAUNCH, env_id, "--port", "0", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_ready(proc: subprocess.Popen, startup_s: float = 30.0) -> str:
    """The URL the server printed, within ``startup_s`` seconds.

    Raises:
        RuntimeError: The process exited or printed nothing in time (its stderr is in the message).
    """
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + startup_s
    while time.monotonic() < deadline:
        if sel.select(timeout=max(0.0, deadline - time.monotonic())):
            line = proc.stdout.readline()
            if line.startswith("agentenv serve:") and " on http" in line:
                return line.rsplit(" on ", 1)[1].strip()
            if not line:  # EOF: it exited
                break
    proc.kill()
    _, err = proc.communicate(timeout=10)
    raise RuntimeError(f"agentenv serve did not start (exit {proc.returncode}): {err[-2000:]}")


@contextmanager
def running(*args: str, **kwargs) -> Iterator[Server]:
    """A server for the ``with`` block; stopped (or killed) afterwards."""
    proc = launch(*args, **kwargs)
    try:
        server = Server(proc, wait_ready(proc))
        yield server
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            stream.close()
