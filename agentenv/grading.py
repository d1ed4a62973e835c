r"""Grading a final ``\\boxed{}`` answer with math-verify, in worker processes killed on a deadline.

math-verify has two traps (DESIGN.md, "Known pitfalls"): its timeouts use ``signal.alarm``, which
raises outside the main thread, and with them off a pathological answer can hang the caller; and it
reads several ``\\boxed{}`` in one text as a set. So:

* the *last* ``\\boxed{...}`` (or ``\\fbox{...}``) is chosen here, with a brace-matching scan, and only
  that answer is graded;
* grading runs in a worker subprocess (``python -m agentenv.grading --worker``, math-verify's own
  timeouts off); the caller waits at
  most ``timeout_s`` seconds, then kills the worker and a fresh one replaces it. This is safe from
  any thread and, through :func:`grade_answer_async`, from async code.

An answer the grader cannot parse is graded wrong with a reason; it never raises.
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

from agentenv.errors import ConfigError

#: ``verify_fn(extracted, golds) -> (correct, reason)``; runs inside the worker process.
VerifyFn = Callable[[str, list[str]], tuple[bool, str]]

_BOX_COMMANDS = ("\\boxed", "\\fbox")


@dataclass(frozen=True)
class GradeResult:
    r"""The verdict on one response.

    Attributes:
        correct: True only when the final boxed answer matches a ground truth.
        extracted: The content of the last ``\\boxed{}``, or None when there is none.
        reason: ``"correct"``, ``"wrong"``, or why the answer could not be graded.
        duration_s: Wall-clock seconds spent grading (waiting for a free worker excluded).
    """

    correct: bool
    extracted: str | None
    reason: str
    duration_s: float = 0.0


def _boxed_at(text: str, start: int) -> str | None:
    r"""Content of the box command ending at ``start`` (``{...}`` or ``\\boxed 5``), else None."""
    i = start
    if i < len(text) and text[i] == "{":
        depth = 0
        j = i
        while j < len(text):
            c = text[j]
            if c == "\\":  # a LaTeX escape (\{, \}, \\): skip the escaped character
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j]
            j += 1
        return None
    if i < len(text) and text[i] == " ":
        j = i + 1
        while j < len(text) and not text[j].isspace() and text[j] not in "$":
            j += 1
        return text[i + 1 : j] or None
    return None


def extract_last_boxed(text: str) -> str | None:
    r"""Return the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); ``\\boxed 5`` gives
    ``5``. Returns None when there is no complete box, or the last one is empty.
    """
    best: tuple[int, str] | None = None
    for cmd in _BOX_COMMANDS:
        pos = text.find(cmd)
        while pos >= 0:
            content = _boxed_at(text, pos + len(cmd))
            if content is not None and (best is None or pos > best[0]):
                best = (pos, content)
            pos = text.find(cmd, pos + 1)
    if best is None or not best[1].strip():
        return None
    return best[1].strip()


def _golds(ground_truth: str | int | float | Sequence[str]) -> list[str]:
    if isinstance(ground_truth, (str, int, float)):
        items = [ground_truth]
    else:
        items = list(ground_truth)
    out = []
    for g in items:
        s = str(g).strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s:
            out.append(s)
    return out


def math_verify_fn(extracted: str, golds: list[str]) -> tuple[bool, str]:
    """Grade ``extracted`` against each gold with math-verify (its timeouts off; run in a worker).

    Returns:
        ``(correct, reason)``: reason is ``"correct"``, ``"wrong"``, ``"unparsable answer"`` or
        ``"unparsable ground truth"``.
    """
    from math_verify import parse, verify

    pred = parse("\\boxed{" + extracted + "}", parsing_timeout=None)
    if not pred:
        return False, "unparsable answer"
    pred_is_math = any(not isinstance(p, str) for p in pred)  # only strings: math-verify could not parse it
    parsed_any_gold = False
    for g in golds:
        gold = parse("\\boxed{" + g + "}", parsing_timeout=None)
        if not gold:
            continue
        parsed_any_gold = True
        if verify(gold, pred, timeout_seconds=None):
            return True, "correct"
    if not parsed_any_gold:
        if any(_normalise(extracted) == _normalise(g) for g in golds):
            return True, "correct (string match; ground truth unparsable)"
        return False, "unparsable ground truth"
    return False, "wrong" if pred_is_math else "unparsable answer"


def _normalise(s: str) -> str:
    return "".join(s.split()).rstrip(".")


def _load_fn(path: str) -> VerifyFn:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _fn_path(fn: VerifyFn | str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{fn.__module__}:{fn.__qualname__}"


def _worker_main(fn_path: str) -> None:
    """Worker loop (``python -m agentenv.grading --worker module:fn``): JSON lines in, JSON lines out.

    The protocol goes over a private copy of the original stdout; fd 1 is pointed at stderr so a
    grader that prints cannot corrupt it.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fn = _load_fn(fn_path)
    if fn_path == _fn_path(math_verify_fn).replace("__main__", "agentenv.grading"):
        import math_verify  # noqa: F401  (imported before "ready": startup is not grading time)
    out.write('"ready"\n')
    for line in sys.stdin:
        try:
            extracted, golds = json.loads(line)
            reply = list(fn(extracted, golds))
        except Exception as exc:  # the worker must survive any grader failure
            reply = [False, f"grader error: {type(exc).__name__}: {exc}"]
        out.write(json.dumps(reply) + "\n")


class _Worker:
    """One grading subprocess and its pipes."""

    def __init__(self, fn_path: str, start_timeout_s: float) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "agentenv.grading", "--worker", fn_path],
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

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


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
        self.timeouts = 0  #: deadline kills so far
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
            timeout_s: Seconds the grading itself may take; past it the worker is killed and the
                answer is graded wrong with reason ``"timeout"``.

        Returns:
            A :class:`GradeResult`; never raises for any answer text.
        """
        extracted = extract_last_boxed(response_text)
        if extracted is None:
            return GradeResult(False, None, "no \\boxed{} answer")
        golds = _golds(ground_truth)
        if not golds:
            return GradeResult(False, extracted, "empty ground truth")
        if self._closed:
            return GradeResult(False, extracted, "grader closed")
        worker = self._take()
        t0 = time.perf_counter()
        try:
            worker.send([extracted, golds])
            reply = worker.read(timeout_s)
            if reply is None:
                self.timeouts += 1
                self._drop(worker)
                return GradeResult(
                    False, extracted, f"timeout after {timeout_s:g} s", time.perf_counter() - t0
                )
            correct, reason = reply
        except (EOFError, OSError, BrokenPipeError) as exc:
            self._drop(worker)
            return GradeResult(
                False, extracted, f"grader crashed: {type(exc).__name__}", time.perf_counter() - t0
            )
        self._give_back(worker)
        return GradeResult(bool(correct), extracted, str(reason), time.perf_counter() - t0)

    async def grade_async(
        self, response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
    ) -> GradeResult:
        """:meth:`grade` without blocking the event loop (runs in a thread)."""
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
    """The process-wide :class:`Grader` (2 workers), started on first use and closed at exit."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Grader(workers=2)
            atexit.register(_default.close)
        return _default


def grade_answer(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    r"""Grade ``response_text``'s last ``\\boxed{}`` with the default grader (see :meth:`Grader.grade`)."""
    return default_grader().grade(response_text, ground_truth, timeout_s=timeout_s)


async def grade_answer_async(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    """Async :func:`grade_answer`; safe inside a running event loop."""
    return await default_grader().grade_async(response_text, ground_truth, timeout_s=timeout_s)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "--worker":
    _worker_main(sys.argv[2])
