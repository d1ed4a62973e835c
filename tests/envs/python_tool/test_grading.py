"""grade_answer on hand cases: last box wins, equivalent forms, unparsable answers, deadlines."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import pytest

from agentenv.envs.python_tool.answers import extract_final_box_group, extract_last_boxed
from agentenv.envs.python_tool.grading import (
    Grader,
    GradeResult,
    grade_answer,
    grade_answer_async,
)
from agentenv.faults import FAULTS


def slow_verify(extracted: str, golds: list[str]) -> tuple[bool, str]:
    """A grader that computes on the answer "hang" for 60 s (runs in the worker process), and
    waits without computing on "stall" (a stuck grader, not an expensive answer)."""
    if extracted == "hang":
        end = time.monotonic() + 60
        while time.monotonic() < end:
            pass
    if extracted == "stall":
        time.sleep(60)
    return extracted in golds, "string compare"


def crashing_verify(extracted: str, golds: list[str]) -> tuple[bool, str]:
    import os

    if extracted == "die":
        os._exit(3)
    return extracted in golds, "string compare"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{2} then \\boxed{3}", "3"),
        ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("\\fbox{7} and finally \\boxed 5$", "5"),
        ("no box here: 42", None),
        ("\\boxed{1} \\boxed{unclosed", "1"),
        ("\\boxed{}", None),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
        ("\\boxed{a \\\\ b\\\\}", "a \\\\ b\\\\"),
    ],
)
def test_extract_last_boxed(text: str, expected: str | None) -> None:
    assert extract_last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$x = \\boxed{2}$ or $x = \\boxed{3}$", ["2", "3"]),
        ("\\boxed{1} " + "a long stretch of working between the two boxed numbers" + " \\boxed{2}", ["2"]),
        ("\\boxed{\\boxed{4}}", ["\\boxed{4}"]),
        ("\\boxed{} and \\boxed{5}", ["5"]),
        ("none", []),
    ],
)
def test_extract_final_box_group(text: str, expected: list[str]) -> None:
    assert extract_final_box_group(text) == expected


def test_box_group_is_reported_as_one_answer() -> None:
    r = grade_answer("$x=\\boxed{3}$ or $x=\\boxed{2}$", "2, 3")
    assert r.correct and r.extracted == "3, 2" and r.reason == "correct (several boxes read as one set)"
    r = grade_answer("$x=\\boxed{3}$ or $x=\\boxed{4}$", "2, 3")
    assert not r.correct and r.extracted == "4" and r.reason == "wrong"


def test_fraction_equals_decimal() -> None:
    r = grade_answer("The answer is \\boxed{\\frac{1}{2}}", "0.5")
    assert r == GradeResult(True, "\\frac{1}{2}", "correct", r.duration_s)


def test_last_box_is_graded_not_the_set() -> None:
    assert grade_answer("first \\boxed{2} then \\boxed{3}", "3").correct
    r = grade_answer("first \\boxed{3} then \\boxed{2}", "3")
    assert not r.correct and r.extracted == "2" and r.reason == "wrong"


def test_alternatives_and_dollar_wrapped_gold() -> None:
    assert grade_answer("\\boxed{2n-2}", ["$2n-2$"]).correct
    assert grade_answer("\\boxed{6630}", ["6630.65", "6630"]).correct
    assert not grade_answer("\\boxed{7}", ["6630.65", "6630"]).correct


def test_no_box_and_unparsable_answer_are_wrong_not_errors() -> None:
    r = grade_answer("I think it is 3", "3")
    assert r == GradeResult(False, None, "no \\boxed{} answer")
    r = grade_answer("\\boxed{\\frac{}{}}", "3")
    assert not r.correct and r.extracted == "\\frac{}{}"
    assert r.reason == "unparsable answer"
    assert grade_answer("\\boxed{)(}", "3").reason == "unparsable answer"
    r = grade_answer("\\boxed{3}", "")
    assert r.reason == "empty ground truth" and not r.correct


def test_grading_from_threads_and_async() -> None:
    results: list[bool] = []

    def work() -> None:
        results.append(grade_answer("\\boxed{1/4}", "0.25").correct)

    ts = [threading.Thread(target=work) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert results == [True, True, True]

    async def main() -> list[GradeResult]:
        return await asyncio.gather(
            grade_answer_async("\\boxed{10}", "10"), grade_answer_async("\\boxed{9}", "10")
        )

    a, b = asyncio.run(main())
    assert a.correct and not b.correct


def test_an_answer_too_expensive_to_verify_is_graded_wrong_with_reason_timeout() -> None:
    kills = FAULTS.total("grader_kills")
    with Grader(workers=1, verify_fn=slow_verify) as g:
        t0 = time.perf_counter()
        r = g.grade("\\boxed{hang}", "1", timeout_s=0.5)
        assert time.perf_counter() - t0 < 10
        assert not r.correct and r.reason == "timeout after 0.5 s" and r.extracted == "hang"
        assert r.timed_out and r.fault is None  # the answer's cost: a verdict, not a fault of the grader
        assert g.timeouts == 1 and FAULTS.total("grader_kills") == kills
        r2 = g.grade("\\boxed{1}", "1", timeout_s=30)
        assert r2.correct and r2.reason == "string compare" and not r2.timed_out


def test_a_tower_of_powers_times_out_in_the_real_grader_as_the_answers_fault() -> None:
    with Grader(workers=1) as g:
        assert g.grade("\\boxed{1}", "1", timeout_s=60).correct  # the worker is up (start-up not timed)
        r = g.grade("so \\boxed{9^{9^{9^{9}}}}", "1", timeout_s=1.0)
        assert (r.correct, r.timed_out, r.fault, r.reason) == (False, True, None, "timeout after 1 s")


def test_a_stalled_worker_is_a_fault_of_the_grader_not_a_verdict() -> None:
    kills = FAULTS.total("grader_kills")
    with Grader(workers=1, verify_fn=slow_verify) as g:
        r = g.grade("\\boxed{stall}", "1", timeout_s=0.5)  # waits without computing
        assert r.fault == "timeout" and not r.timed_out and r.reason.startswith("grader stalled")
        assert FAULTS.total("grader_kills") == kills + 1
        assert g.grade("\\boxed{1}", "1", timeout_s=30).correct  # a fresh worker


def test_a_stopped_worker_is_a_fault_and_a_killed_one_a_crash() -> None:
    with Grader(workers=1, verify_fn=slow_verify) as g:
        assert g.grade("\\boxed{1}", "1", timeout_s=30).correct
        (worker,) = g._idle
        os.kill(worker.proc.pid, signal.SIGSTOP)  # frozen from outside: not the answer's doing
        r = g.grade("\\boxed{1}", "1", timeout_s=0.5)
        assert (r.fault, r.timed_out, r.correct) == ("timeout", False, False)
        assert g.grade("\\boxed{1}", "1", timeout_s=30).correct
        (worker,) = g._idle
        threading.Timer(0.3, os.kill, (worker.proc.pid, signal.SIGKILL)).start()
        r = g.grade("\\boxed{hang}", "1", timeout_s=30)  # killed mid-grade
        assert (r.fault, r.timed_out, r.correct) == ("crashed", False, False)


def test_crashed_worker_is_replaced() -> None:
    with Grader(workers=1, verify_fn=crashing_verify) as g:
        r = g.grade("\\boxed{die}", "1", timeout_s=30)
        assert not r.correct and r.reason.startswith("grader crashed")
        assert g.grade("\\boxed{1}", "1", timeout_s=30).correct


def printing_verify(extracted: str, golds: list[str]) -> tuple[bool, str]:
    print("noise on stdout {not json")
    return extracted in golds, "string compare"


def test_grader_output_does_not_corrupt_the_protocol() -> None:
    with Grader(workers=1, verify_fn=printing_verify) as g:
        assert g.grade("\\boxed{1}", "1", timeout_s=30).correct
        assert not g.grade("\\boxed{2}", "1", timeout_s=30).correct


def test_waiting_caller_gets_a_fresh_worker_after_a_timeout_kill() -> None:
    with Grader(workers=1, verify_fn=slow_verify) as g:
        g.grade("\\boxed{1}", "1", timeout_s=30)  # start the only worker
        results: dict[str, object] = {}

        def hang() -> None:
            results["hang"] = g.grade("\\boxed{hang}", "1", timeout_s=1.0)

        def fine() -> None:
            time.sleep(0.2)  # queue behind the hanging call
            results["fine"] = g.grade("\\boxed{1}", "1", timeout_s=30)

        ts = [threading.Thread(target=hang), threading.Thread(target=fine)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in ts), "a caller waiting for a worker was never woken"
        assert results["hang"].reason.startswith("timeout")
        assert results["fine"].correct  # waiting for a worker did not count against its deadline
