"""One training run in a child process of its own (``agentenv study`` and ``agentenv compare``).

A command that trains several runs one after the other gives each a fresh process, so whatever a
run leaves in memory when :func:`agentenv.trainer.train.train` returns (the allocator's heap, the
weight snapshots of ``staleness.forced_lag``, caches) cannot add up over the runs: in one process,
``agentenv study gate_under_lag``'s second setting passed 24 GB and was killed. A run killed from
outside (the out-of-memory killer) is reported with its name instead of ending the command without
a word.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentenv.errors import AgentEnvError, Interrupted
from agentenv.trainer.config import TrainConfig

__all__ = ["STOPPED_EXIT", "train_in_child", "train_until_stopped"]

#: A run's child process exits with this status when Ctrl-C (or SIGTERM) stopped its run.
STOPPED_EXIT = 3


def train_in_child(cfg: TrainConfig, run_dir: Path, *, resume: bool, seconds: float | None, head: str,
                   then: str, target: Callable[..., None] | None = None) -> tuple[bool, bool]:
    """Train one run (:func:`train_until_stopped`) in a fresh child process and wait for it.

    ``seconds`` is the update loop's wall-clock budget (train's ``loop_seconds``; None: the run's
    ``run.updates``). ``head`` names the run in the error below and ``then`` tells there how to go on
    (the caller's command line: ``"run the same command with --resume"``).

    Returns ``(finished, user_stop)``: whether the run finished (its updates or seconds spent), and
    whether a Ctrl-C or SIGTERM arrived (the caller then stops after this run; a run stopped before
    it finished is resumable with train's ``resume``).

    The child is spawned (no fork of a process that holds threads and a model), prints to the same
    terminal, and gets the terminal's Ctrl-C itself; a SIGINT or SIGTERM sent to this process alone is
    passed on to it, also while it starts (only when this is the main thread: elsewhere Python cannot
    set signal handlers). A child killed by SIGINT or SIGTERM counts as stopped, and so does a child
    that failed after this process got (and passed on) one of them: a Ctrl-C that lands while the
    child still imports ends it with a traceback and exit status 1. The run folder keeps what the
    child wrote. ``target`` (tests) replaces the child's body :func:`_child` (a module-level function
    with the same arguments).

    Raises:
        AgentEnvError: the child failed (its error is above on stderr) or was killed by a signal other
            than SIGINT or SIGTERM, naming ``head``, the exit status and ``then``.
    """
    child = multiprocessing.get_context("spawn").Process(
        target=target or _child, args=(cfg, str(run_dir), resume, seconds), name=f"agentenv-run-{run_dir.name}")
    signalled: list[int] = []

    def pass_on(signum: int, _frame: Any) -> None:
        signalled.append(signum)
        if child.pid is not None and child.exitcode is None:
            os.kill(child.pid, signum)

    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, pass_on) for sig in (signal.SIGINT, signal.SIGTERM)} if on_main_thread else {}
    try:
        child.start()
        if signalled:  # arrived while the child was starting, before it had a pid
            os.kill(child.pid, signalled[-1])
        child.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    code = child.exitcode
    if code == 0:
        return True, bool(signalled)
    if code in (STOPPED_EXIT, -signal.SIGINT, -signal.SIGTERM) or signalled:
        return False, True  # a signal that lands mid-import ends the child with a traceback (exit 1): a stop too
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"was killed by {name}" + (" (out of memory? see dmesg)" if -code == signal.SIGKILL else "")
    else:
        how = f"failed with exit status {code} (its error is printed above)"
    raise AgentEnvError(f"{head}: the run's process {how}; its run folder {run_dir} keeps what it wrote: "
                        f"fix the cause and {then}")


def _child(cfg: TrainConfig, run_dir: str, resume: bool, seconds: float | None) -> None:
    """The child's body (:func:`train_in_child`): exit 0; :data:`STOPPED_EXIT` when stopped; 2 on an error.

    It sets the allocator as ``agentenv``'s command line does (a spawned process does not inherit
    it). A Ctrl-C that lands before the run's own handler is set (while the recipe loads its model),
    or one that stops the warm-up (:class:`~agentenv.errors.Interrupted`), is a stop. One that lands
    earlier still, while the child unpickles its arguments (and so imports torch), kills it by
    SIGINT, which :func:`train_in_child` counts as a stop too.
    """
    try:
        from agentenv.malloc import return_freed_memory_to_os

        return_freed_memory_to_os()  # before any tensor exists, as agentenv/cli.py does
        stopped = asyncio.run(train_until_stopped(cfg, Path(run_dir), resume=resume, seconds=seconds))
    except KeyboardInterrupt:
        sys.exit(STOPPED_EXIT)
    except Interrupted as exc:  # stopped where nothing could be kept (mid warm-up): a stop, not a failure
        print(f"agentenv: {exc}", file=sys.stderr)
        sys.exit(STOPPED_EXIT)
    except AgentEnvError as exc:  # a clear error (a refused resume, a broken env): one line, as the CLI prints
        print(f"agentenv: {exc}", file=sys.stderr)
        sys.exit(2)
    if stopped:
        sys.exit(STOPPED_EXIT)


async def train_until_stopped(cfg: TrainConfig, run_dir: Path, *, resume: bool, seconds: float | None) -> bool:
    """Train one run; Ctrl-C or SIGTERM stops it cleanly (as in ``agentenv train``).

    With ``seconds``, the update loop ends after that many seconds of wall-clock. The budget counts
    the update loop only (train's ``loop_seconds``), so a run that computes its "before" evaluation
    and one that copied it get the same time to train. A spent budget is not an interruption: the
    run is evaluated on the held-out tasks after it, as one that reached its updates. Returns True
    when Ctrl-C (or SIGTERM) stopped it.
    """
    from agentenv.trainer.train import train

    user = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, user.set)
    try:
        await train(cfg, run_dir, resume=resume, stop=user, loop_seconds=seconds)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    return user.is_set()
