"""Bodies for a study setting's child process (``study._train_setting_in_child(target=...)``).

Module-level, so that a spawned child can import them; each ends the way a real setting can.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path


def finishes(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Writes what it was handed and exits 0, as a setting that reached its budget."""
    Path(run_dir, "child.txt").write_text(f"{cfg} {resume} {seconds} {os.getpid()}")


def stopped_by_the_user(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Exits as a setting Ctrl-C stopped does."""
    from agentenv.trainer.study import STOPPED_EXIT

    sys.exit(STOPPED_EXIT)


def killed(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Dies by SIGKILL, as under the out-of-memory killer."""
    os.kill(os.getpid(), signal.SIGKILL)


def raises(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Raises, as a setting whose config cannot train."""
    raise RuntimeError("this setting cannot train")


def waits(cfg, run_dir: str, resume: bool, seconds) -> None:
    """The real child body around a run that waits up to a minute for its stop (a setting still training)."""
    import asyncio

    from agentenv.trainer import recipe, study

    async def trains_until_stopped(cfg, run_dir, *, resume, stop, loop_seconds):
        await asyncio.wait_for(stop.wait(), 60)

    recipe.train = trains_until_stopped  # in this child only
    study._setting_child(cfg, run_dir, resume, seconds)


def terminated(cfg, run_dir: str, resume: bool, seconds) -> None:
    """Dies by SIGTERM, as a setting terminated before its run set its handlers."""
    os.kill(os.getpid(), signal.SIGTERM)


def refused(cfg, run_dir: str, resume: bool, seconds) -> None:
    """The real child body on a setting that cannot train: a clear error, exit status 2."""
    from agentenv.errors import ConfigError
    from agentenv.trainer import recipe, study

    async def cannot_train(*args, **kwargs):
        raise ConfigError("this setting cannot train")

    recipe.train = cannot_train  # in this child only
    study._setting_child(cfg, run_dir, resume, seconds)
