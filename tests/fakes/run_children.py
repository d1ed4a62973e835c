"""Bodies for a run's child process (``run_process.train_in_child(target=...)``).

Module-level, so that a spawned child can import them; each ends the way a real run can.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def finishes(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Writes what it was handed and exits 0, as a run that reached its budget."""
    Path(run_dir, "child.txt").write_text(f"{cfg} {resume} {seconds} {os.getpid()}")


def stopped_by_the_user(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Exits as a run Ctrl-C stopped does."""
    from agentenv.trainer.run_process import STOPPED_EXIT

    sys.exit(STOPPED_EXIT)


def killed(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Dies by SIGKILL, as under the out-of-memory killer."""
    os.kill(os.getpid(), signal.SIGKILL)


def raises(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Raises, as a run whose config cannot train."""
    raise RuntimeError("this run cannot train")


def waits(cfg, run_dir: str, resume: bool, seconds) -> None:
    """The real child body around a run that waits up to a minute for its stop (a run still training)."""
    import asyncio

    from agentenv.trainer import run_process
    from agentenv.trainer import train as train_loop

    async def trains_until_stopped(cfg, run_dir, *, resume, stop, loop_seconds):
        await asyncio.wait_for(stop.wait(), 60)

    train_loop.train = trains_until_stopped  # in this child only
    run_process._child(cfg, run_dir, resume, seconds)


def terminated(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Dies by SIGTERM, as a run terminated before its run set its handlers."""
    os.kill(os.getpid(), signal.SIGTERM)


def refused(cfg, run_dir: str, resume: bool, seconds) -> None:
    """The real child body on a run that cannot train: a clear error, exit status 2."""
    from agentenv.errors import ConfigError
    from agentenv.trainer import run_process
    from agentenv.trainer import train as train_loop

    async def cannot_train(*args, **kwargs):
        raise ConfigError("this run cannot train")

    train_loop.train = cannot_train  # in this child only
    run_process._child(cfg, run_dir, resume, seconds)


def interrupted_in_warm_up(cfg, run_dir: str, resume: bool, seconds) -> None:
    """The real child body on a run stopped by Ctrl-C during its warm-up (train raises Interrupted)."""
    from agentenv.errors import Interrupted
    from agentenv.trainer import run_process
    from agentenv.trainer import train as train_loop

    async def stopped_in_warm_up(*args, **kwargs):
        raise Interrupted("stopped during the tool-use warm-up after 3 of 16 steps (nothing cached)")

    train_loop.train = stopped_in_warm_up  # in this child only
    run_process._child(cfg, run_dir, resume, seconds)


def sleeps_before_its_body(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Sleeps a minute outside the real body, as a child still importing when a Ctrl-C lands (exit 1)."""
    import time

    time.sleep(60)
