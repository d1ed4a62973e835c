"""One training run in a child process (``agentenv study`` and ``agentenv compare``): how each end is reported."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from agentenv.errors import AgentEnvError
from agentenv.trainer import run_process
from agentenv.trainer import train as train_loop
from tests.fakes import run_children


def test_the_wall_clock_budget_ends_a_run_and_is_not_a_user_stop(monkeypatch):
    seen = {}

    async def fake_train(cfg, run_dir, *, resume, stop, loop_seconds):  # the real loop's budget: its own timer
        seen.update(resume=resume, loop_seconds=loop_seconds)
        await asyncio.sleep(loop_seconds)
        assert not stop.is_set()  # the budget is not a user's stop: the run is evaluated after it

    monkeypatch.setattr(train_loop, "train", fake_train)
    t0 = time.monotonic()
    assert asyncio.run(run_process.train_until_stopped(None, None, resume=True, seconds=0.2)) is False
    assert seen == {"resume": True, "loop_seconds": 0.2} and time.monotonic() - t0 < 2


def test_each_run_trains_in_its_own_process_and_a_killed_one_is_reported(tmp_path):
    def child(target):
        return run_process.train_in_child("cfg", tmp_path, resume=True, seconds=9.0, head="[study s] 2/3 b",
                                          then="run the same command with --resume", target=target)

    assert child(run_children.finishes) == (True, False)  # finished: the caller goes on to the next run
    text = (tmp_path / "child.txt").read_text().split()
    assert text[:3] == ["cfg", "True", "9.0"] and int(text[3]) != os.getpid()  # another process, same arguments
    assert child(run_children.stopped_by_the_user) == (False, True)  # Ctrl-C: the caller stops, resumable
    assert child(run_children.terminated) == (False, True)  # SIGTERM before its handler was set: a stop too
    assert child(run_children.interrupted_in_warm_up) == (False, True)  # Ctrl-C mid warm-up: a stop, not a failure
    with pytest.raises(AgentEnvError, match=r"failed with exit status 2 .*fix the cause and run the same command"):
        child(run_children.refused)  # the real body: a clear error in the run -> one line, status 2
    with pytest.raises(AgentEnvError, match=r"2/3 b: the run's process was killed by SIGKILL \(out of memory"):
        child(run_children.killed)
    with pytest.raises(AgentEnvError, match=r"failed with exit status 1 .*--resume$"):
        child(run_children.raises)


def test_a_sigint_sent_to_the_parent_alone_reaches_the_run_s_process(tmp_path):
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))  # not the terminal's: this process only
    timer.start()
    t0 = time.monotonic()
    try:
        ended = run_process.train_in_child("cfg", tmp_path, resume=False, seconds=None, head="h", then="go on",
                                           target=run_children.waits)
    finally:
        timer.cancel()
    assert ended == (False, True) and time.monotonic() - t0 < 30  # passed on: the child did not sleep its minute
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the parent's own handler is back


def test_a_sigint_that_lands_while_the_child_still_imports_is_a_stop_not_a_failure(tmp_path):
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:  # the child dies of the KeyboardInterrupt with a traceback and exit status 1
        ended = run_process.train_in_child("cfg", tmp_path, resume=False, seconds=None, head="h", then="go on",
                                           target=run_children.sleeps_before_its_body)
    finally:
        timer.cancel()
    assert ended == (False, True)
