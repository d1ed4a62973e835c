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
    """Sleeps for a minute, as a setting still training (a SIGINT ends it with KeyboardInterrupt)."""
    import time

    time.sleep(60)
