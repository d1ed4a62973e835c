r"""Grading a final ``\\boxed{}`` answer, in worker processes killed on a deadline.

Which box is the answer and how it is compared with the reference is
:mod:`agentenv.envs.python_tool.answers`. math-verify's timeouts use ``signal.alarm``, which raises
outside the main thread, and with them off a pathological answer can hang the caller
(docs/architecture.md, "Known pitfalls"). So grading runs in a worker subprocess
(:data:`_WORKER_COMMAND`, math-verify's own timeouts off); the caller waits at most ``timeout_s``
seconds, then kills the worker and a fresh one replaces it. This is safe from any thread and, through
:func:`grade_answer_async`, from async code.

Who is at fault when grading does not finish (docs/grading.md, "Timeouts"): a worker that spent at
least :data:`_ANSWER_CPU_SHARE` of the deadline computing was busy with the answer, which is too
expensive to verify: graded wrong with reason ``"timeout after N s"`` (``timed_out``), the policy's
doing. A worker that passed the deadline without computing (stopped, or starved of CPU) or died is
the grader's failure (``fault``): the answer was not graded and must not be scored.

An answer the grader cannot parse is graded wrong with a reason; grading raises only when a worker
cannot be started.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.envs.python_tool.answers import (
    extract_final_box_group,
    extract_last_boxed,
    gold_answers,
    is_list_answer,
    math_verify_fn,
    normalise_answer,
    top_level_commas,
)
from agentenv.errors import ConfigError
from agentenv.faults import FAULTS

#: ``verify_fn(extracted, golds) -> (correct, reason)``; runs inside the worker process.
VerifyFn = Callable[[str, list[str]], tuple[bool, str]]



@dataclass(frozen=True)
class GradeResult:
    r"""The verdict on one response.

    Attributes:
        correct: True only when the final boxed answer matches a ground truth.
        extracted: The content of the last ``\\boxed{}``, or None when there is none; when the answer
            was accepted as a group of boxes, their contents joined by ``", "``.
        reason: ``"correct"`` (``"correct (several boxes read as one set)"`` for a box group),
            ``"wrong"``, or why the answer could not be graded.
        duration_s: Wall-clock seconds spent grading (waiting for a free worker excluded).
        fault: ``"timeout"`` (the worker passed the deadline without computing: stopped or starved
            of CPU; it was killed) or ``"crashed"`` (the worker died): the answer was not graded,
            for reasons outside the policy; else None.
        timed_out: The answer was too expensive to verify: the worker computed on it until the
            deadline and was killed. A verdict (wrong, reason ``"timeout after N s"``), not a fault.
    """

    correct: bool
    extracted: str | None
    reason: str
    duration_s: float = 0.0
    fault: str | None = None
    timed_out: bool = False


def _load_fn(path: str) -> VerifyFn:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _fn_path(fn: VerifyFn | str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{fn.__module__}:{fn.__qualname__}"


def _worker_main(fn_path: str) -> None:
    """Worker loop (``python -c _WORKER_COMMAND module:fn``): JSON lines in, JSON lines out.

    The protocol goes over a private copy of the original stdout; fd 1 is pointed at stderr so a
    grader that prints cannot corrupt it.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fn = _load_fn(fn_path)
    if fn_path == _fn_path(math_verify_fn).replace("__main__", "agentenv.envs.python_tool.answers"):
        import math_verify  # noqa: F401  (imported before "ready": startup is not grading time)
    out.write('"ready"\n')
    for line in sys.stdin:
        try:
            extracted, golds = json.loads(line)
            reply = list(fn(extracted, golds))
        except Exception as exc:  # the worker must survive any grader failure
            reply = [False, f"grader error: {type(exc).__name__}: {exc}"]
        out.write(json.dumps(reply) + "\n")


#: The worker's program: imported, not run as ``-m`` (this module is imported by its package's
#: ``__init__`` first, so ``runpy`` would warn on every worker start).
_WORKER_COMMAND = "import sys; from agentenv.envs.python_tool.grading import _worker_main; _worker_main(sys.argv[1])"


#: Least share of the deadline a worker must have spent on CPU for a timeout to be the answer's
#: (graded wrong); below it the worker was stopped or starved, a fault of the grader.
_ANSWER_CPU_SHARE = 0.1

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Worker:
    """One grading subprocess and its pipes."""

    def __init__(self, fn_path: str, start_timeout_s: float) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_COMMAND, fn_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._buf = b""
        try:
            ready = self.read(start_timeout_s)
        except EOFError:
            ready = None
        if ready != "ready":
            self.kill()
            raise ConfigError(f"grader worker ({fn_path}) did not start within {start_timeout_s} s")

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout_s: float) -> Any:
        """One JSON reply; None on timeout; EOFError when the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("grader worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the worker has used so far; None where ``/proc`` cannot tell."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (fields 14, 15 of stat)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def _box_group_answer(response_text: str, golds: list[str]) -> tuple[str, list[str]] | None:
    r"""The final box group joined as one list answer, and the golds that are lists/sets; or None.

    Only when the final group (:func:`extract_final_box_group`) has 2+ boxes, each holding one item
    (no top-level comma), and some gold is a bare list (``2, 3``) or a set (``\\{2, 3\\}``): tuples,
    intervals and single values are never matched by several boxes.
    """
    group = extract_final_box_group(response_text)
    if len(group) < 2 or any(top_level_commas(normalise_answer(b, plain_commas=True)) for b in group):
        return None
    list_golds = [g for g in golds if is_list_answer(normalise_answer(g, plain_commas=True))]
    if not list_golds:
        return None
    return ", ".join(group), list_golds


class Grader:
    """A small pool of grading worker processes; thread-safe.

    Args:
        workers: Most worker processes alive at once (each holds sympy: ~100 MB).
        verify_fn: Importable top-level function (or ``"module:function"``) ``(extracted, golds) ->
            (correct, reason)`` run in the worker; default :func:`math_verify_fn`.
        start_timeout_s: Seconds a new worker may take to import its grader (not counted in any
            grading deadline).

    Raises:
        ConfigError: ``workers < 1``.
    """

    def __init__(
        self, *, workers: int = 1, verify_fn: VerifyFn | str = math_verify_fn, start_timeout_s: float = 120.0
    ):
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self._fn_path = _fn_path(verify_fn)  # a fresh interpreter: no fork of a threaded process
        self._start_timeout_s = start_timeout_s
        self._max = workers
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self.timeouts = 0  #: deadline kills so far (answers too expensive and stalled workers)
        self.restarts = 0  #: workers started after the first

    def _take(self) -> _Worker:
        """An idle worker, a new one while fewer than ``workers`` exist, else wait for either."""
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._count < self._max:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return _Worker(self._fn_path, self._start_timeout_s)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
        self._drop(worker)

    def _drop(self, worker: _Worker) -> None:
        """Kill ``worker``; a waiting caller may then start a fresh one."""
        worker.kill()
        with self._cond:
            self._count -= 1
            self.restarts += 1
            self._cond.notify()

    def grade(
        self, response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
    ) -> GradeResult:
        r"""Grade the last ``\\boxed{}`` of ``response_text`` against ``ground_truth``.

        Args:
            response_text: The model's final reply.
            ground_truth: One answer, or several accepted alternatives.
            timeout_s: Seconds the grading itself may take; past it the worker is killed. When the
                worker spent the time computing (at least :data:`_ANSWER_CPU_SHARE` of it on CPU),
                the answer is graded wrong with reason ``"timeout after N s"`` and ``timed_out``;
                otherwise the result carries ``fault="timeout"`` (the grader stalled).

        Returns:
            A :class:`GradeResult`; no answer text makes it raise (a hang, a crash or a grader
            exception is a wrong verdict with its reason, or a ``fault`` for the caller to handle).

        Raises:
            ConfigError: A new worker process did not start within ``start_timeout_s``.
        """
        extracted = extract_last_boxed(response_text)
        if extracted is None:
            return GradeResult(False, None, "no \\boxed{} answer")
        golds = gold_answers(ground_truth)
        if not golds:
            return GradeResult(False, extracted, "empty ground truth")
        if self._closed:
            return GradeResult(False, extracted, "grader closed")
        tries = [(extracted, golds, "")]
        group = _box_group_answer(response_text, golds)
        if group is not None:
            tries.append((*group, " (several boxes read as one set)"))
        worker = self._take()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        verdict: tuple[bool, str] = (False, "wrong")
        for answer, try_golds, note in tries:
            try:
                cpu0 = worker.cpu_s()
                worker.send([answer, try_golds])
                reply = worker.read(max(0.0, deadline - time.monotonic()))
                if reply is None:
                    return self._timed_out(worker, extracted, timeout_s, cpu0, t0)
                correct, reason = reply
            except (EOFError, OSError, BrokenPipeError) as exc:
                self._drop(worker)
                FAULTS.record("grader_crashes", time.perf_counter() - t0)
                return GradeResult(
                    False, extracted, f"grader crashed: {type(exc).__name__}", time.perf_counter() - t0, "crashed"
                )
            if correct:
                self._give_back(worker)
                return GradeResult(True, answer, str(reason) + note, time.perf_counter() - t0)
            if not note:
                verdict = (False, str(reason))
        self._give_back(worker)
        return GradeResult(False, extracted, verdict[1], time.perf_counter() - t0)

    def _timed_out(self, worker: _Worker, extracted: str, timeout_s: float, cpu0: float | None,
                   t0: float) -> GradeResult:
        """Kill ``worker`` past its deadline; the answer's timeout if it was computing, else a fault."""
        cpu1 = worker.cpu_s()
        used = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        self.timeouts += 1
        self._drop(worker)
        duration = time.perf_counter() - t0
        if used is None or used >= _ANSWER_CPU_SHARE * timeout_s:
            return GradeResult(False, extracted, f"timeout after {timeout_s:g} s", duration, timed_out=True)
        FAULTS.record("grader_kills", duration)  # from the stalled request to the kill
        return GradeResult(False, extracted, f"grader stalled: {used:.2f} s of CPU in the {timeout_s:g} s deadline",
                           duration, "timeout")

    async def grade_async(
        self, response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
    ) -> GradeResult:
        """:meth:`grade` without blocking the event loop (runs in a thread).

        Raises:
            ConfigError: A new worker process did not start within ``start_timeout_s``.
        """
        return await asyncio.to_thread(self.grade, response_text, ground_truth, timeout_s=timeout_s)

    def close(self) -> None:
        """Kill every idle worker now and busy ones when they finish. Safe to call twice."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: Grader | None = None
_default_lock = threading.Lock()


def default_grader() -> Grader:
    """The process-wide :class:`Grader` (2 workers), started on first use and closed at exit.

    Raises:
        Nothing: workers start lazily, on the first grade.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Grader(workers=2)
            atexit.register(_default.close)
        return _default


def grade_answer(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    r"""Grade ``response_text``'s last ``\\boxed{}`` with the default grader (see :meth:`Grader.grade`).

    Raises:
        ConfigError: A new worker process did not start within its start timeout.
    """
    return default_grader().grade(response_text, ground_truth, timeout_s=timeout_s)


async def grade_answer_async(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    """Async :func:`grade_answer`; safe inside a running event loop.

    Raises:
        ConfigError: A new worker process did not start within its start timeout.
    """
    return await default_grader().grade_async(response_text, ground_truth, timeout_s=timeout_s)

