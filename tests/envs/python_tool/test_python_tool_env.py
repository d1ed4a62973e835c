"""PythonToolEnv: episode logic with a scripted sandbox, and real episodes in the process sandbox."""

from __future__ import annotations

import json

import pytest

import agentenv
from agentenv.envs.python_tool import PYTHON_TOOL_SCHEMA, PythonToolEnv
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.grading import Grader
from agentenv.errors import ConfigError, DataError, GradingError, ResetNeeded
from agentenv.sandboxes import ExecResult, ExecStatus

PROBLEMS = [MathProblem(f"t/{i}", f"What is {i} + {i}?", str(2 * i), "t") for i in range(5)]


def call(code: str, name: str = "python") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"


class FakeSandbox:
    backend = "fake"
    isolation = "none"

    def __init__(self) -> None:
        self.codes: list[str] = []
        self.closed = False

    async def run(self, code: str, *, timeout_s: float | None = None) -> ExecResult:
        self.codes.append(code)
        if "raise" in code:
            return ExecResult(ExecStatus.ERROR, stdout="before\n", error="Traceback...\nValueError: boom")
        return ExecResult(ExecStatus.OK, stdout=f"ran {len(self.codes)}\n")

    async def close(self) -> None:
        self.closed = True


class FakePool:
    backend = "fake"

    def __init__(self) -> None:
        self.handed: list[FakeSandbox] = []
        self.released: list[FakeSandbox] = []
        self.closed = False

    async def acquire(self) -> FakeSandbox:
        sb = FakeSandbox()
        self.handed.append(sb)
        return sb

    async def release(self, sb: FakeSandbox) -> None:
        self.released.append(sb)

    async def close(self) -> None:
        self.closed = True


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=1) as g:
        yield g


def make_env(grader, **kw) -> tuple[PythonToolEnv, FakePool]:
    pool = FakePool()
    return PythonToolEnv(problems=PROBLEMS, sandbox_pool=pool, grader=grader, **kw), pool


async def test_declared_contract(grader) -> None:
    env, _ = make_env(grader)
    assert env.observation_role == "tool"
    assert list(env.tools) == [PYTHON_TOOL_SCHEMA]
    assert PYTHON_TOOL_SCHEMA["function"]["parameters"]["required"] == ["code"]
    assert "python" in env.system_prompt and "\\boxed{}" in env.system_prompt


async def test_seeded_reset_is_reproducible_and_index_option(grader) -> None:
    env, _ = make_env(grader)
    picks = [(await env.reset(seed=s))[1]["problem_id"] for s in (3, 3, 4, 3)]
    assert picks[0] == picks[1] == picks[3]
    obs, info = await env.reset(options={"index": 2})
    assert info["problem_id"] == "t/2" and obs.startswith("What is 2 + 2?") and "\\boxed{}" in obs
    with pytest.raises(DataError):
        await env.reset(options={"index": 5})


async def test_tasks_are_the_problems_in_order_and_task_option_plays_one(grader) -> None:
    env, _ = make_env(grader)
    tasks = env.tasks()
    assert tasks.ids == ("t/0", "t/1", "t/2", "t/3", "t/4") and tasks.kinds == ("t",) * 5
    obs, info = await env.reset(seed=9, options={"task": 3})
    assert obs.startswith("What is 3 + 3?") and info["task_id"] == info["problem_id"] == "t/3"
    assert (await env.reset(seed=3))[1]["task_id"] == (await env.reset(seed=3))[1]["problem_id"]
    with pytest.raises(DataError, match="out of range"):
        await env.reset(options={"task": 5})


def test_problem_kind_reads_the_family_or_subject_from_the_id() -> None:
    from agentenv.envs.python_tool.env import problem_kind

    assert problem_kind(MathProblem("tool_arith_eval/lcm/3", "q", "1", "tool_arith_eval")) == "lcm"
    assert problem_kind(MathProblem("math500/test/precalculus/807.json", "q", "1", "math500")) == "precalculus"
    assert problem_kind(MathProblem("aime24/60", "q", "1", "aime24")) == "aime24"


def test_max_problem_chars_keeps_the_short_problems_in_order(grader) -> None:
    mixed = [*PROBLEMS, MathProblem("t/long", "What is " + "1 + " * 40 + "1?", "41", "t")]
    env = PythonToolEnv(problems=mixed, grader=grader, max_problem_chars=15)
    assert env.tasks().ids == ("t/0", "t/1", "t/2", "t/3", "t/4")
    assert len(PythonToolEnv(problems=mixed, grader=grader).problems) == 6
    with pytest.raises(ConfigError, match="max_problem_chars=5 leaves none of the 6 problems of the given problems"):
        PythonToolEnv(problems=mixed, grader=grader, max_problem_chars=5)


async def test_tool_turns_then_correct_answer(grader) -> None:
    env, pool = make_env(grader)
    await env.reset(options={"index": 3})
    r = await env.step("Let me check. " + call("x = 3 + 3\nprint(x)"))
    assert (r.reward, r.terminated, r.truncated) == (0.0, False, False)
    assert r.observation == "status: ok\nstdout:\nran 1"
    r = await env.step(call("raise ValueError('boom')"))
    assert (
        "status: error" in r.observation and "ValueError: boom" in r.observation and "before" in r.observation
    )
    assert r.info["tool_errors"] == 1 and r.info["tool_calls"] == 2
    assert len(pool.handed) == 1 and pool.handed[0].codes == [
        "x = 3 + 3\nprint(x)",
        "raise ValueError('boom')",
    ]
    r = await env.step("So the answer is \\boxed{6}.")
    assert (r.reward, r.terminated, r.truncated) == (1.0, True, False)
    assert r.info["extracted_answer"] == "6" and r.info["ground_truth"] == "6" and r.info["correct"]
    assert r.info["grading_s"] > 0 and r.info["sandbox_backend"] == "fake"
    assert pool.released == pool.handed  # the episode's sandbox went back
    with pytest.raises(ResetNeeded):
        await env.step("more")


async def test_wrong_answer_and_no_answer_score_zero(grader) -> None:
    env, _ = make_env(grader)
    await env.reset(options={"index": 1})
    r = await env.step("\\boxed{3}")
    assert r.reward == 0.0 and r.terminated and r.info["grade_reason"] == "wrong"
    await env.reset(options={"index": 1})
    r = await env.step("I don't know")
    assert r.reward == 0.0 and r.terminated and r.info["extracted_answer"] is None


async def test_an_answer_that_hangs_the_grader_scores_zero_with_reason_timeout(grader) -> None:
    env, _ = make_env(grader, grade_timeout_s=1.0)
    await env.reset(options={"index": 1})
    assert (await env.step("\\boxed{2}")).reward == 1.0  # the worker is up: its start-up is not timed
    await env.reset(options={"index": 1})
    r = await env.step("\\boxed{9^{9^{9^{9}}}}")  # math-verify computes on it until the deadline
    assert (r.reward, r.terminated) == (0.0, True)
    assert r.info["grade_reason"] == "timeout after 1 s" and r.info["grading_timeout"] is True
    await env.reset(options={"index": 1})
    assert (await env.step("\\boxed{2}")).info["grading_timeout"] is False


def stalling_or_dying_verify(extracted: str, golds: list[str]) -> tuple[bool, str]:
    """Runs in the grading worker: waits without computing on "stall", exits on "die"."""
    import os
    import time

    if extracted == "stall":
        time.sleep(60)
    if extracted == "die":
        os._exit(3)
    return extracted in golds, "string compare"


async def test_a_grader_that_stalls_or_dies_fails_the_episode_for_a_replay() -> None:
    for answer in ("stall", "die"):
        with Grader(workers=1, verify_fn=stalling_or_dying_verify) as g:
            env, pool = make_env(g, grade_timeout_s=0.5)
            await env.reset(options={"index": 1})
            assert (await env.step("\\boxed{2}")).reward == 1.0  # the worker is up
            await env.reset(options={"index": 1})
            with pytest.raises(GradingError, match="could not be graded"):
                await env.step(f"\\boxed{{{answer}}}")
            assert pool.released == pool.handed
            with pytest.raises(ResetNeeded):  # the episode is over, unscored
                await env.step("\\boxed{2}")


async def test_max_turns_truncates(grader) -> None:
    env, pool = make_env(grader, max_turns=2)
    await env.reset(options={"index": 0})
    assert not (await env.step(call("print(1)"))).truncated
    r = await env.step(call("print(2)"))
    assert r.truncated and not r.terminated and r.reward == 0.0 and r.info["truncated_by"] == "max_turns"
    assert pool.released == pool.handed
    with pytest.raises(ResetNeeded):
        await env.step("\\boxed{0}")


async def test_bad_calls_are_error_observations(grader) -> None:
    env, pool = make_env(grader)
    await env.reset(options={"index": 0})
    r = await env.step(
        call("print(0)")  # fine: runs, and its result comes first
        + '<tool_call>{"name": "python", "arguments": {"code": "1"</tool_call>'  # malformed JSON
        + call("print(1)", name="shell")  # unknown tool
        + call("   ")  # empty code
    )
    assert not r.terminated and not r.truncated
    assert r.observation.startswith("[call 1 of 4]\nstatus: ok\nstdout:\nran 1")
    assert "[call 2 of 4]\nerror: malformed tool call" in r.observation
    assert "unknown tool 'shell'" in r.observation and "'code' argument is empty" in r.observation
    assert r.info["tool_errors"] == 3 and r.info["tool_calls"] == 3
    assert pool.handed[0].codes == ["print(0)"]  # no bad call reached the sandbox


async def test_trailing_text_error_runs_no_call_and_says_why(grader) -> None:
    env, pool = make_env(grader, trailing_text="error")
    await env.reset(options={"index": 0})
    r = await env.step(call("print(1)") + '"')
    assert r.observation.startswith("error: malformed tool call: text after </tool_call> (\'\"\')")
    assert r.info["tool_errors"] == 1 and r.info["tool_calls"] == 0
    assert not pool.handed or pool.handed[0].codes == []  # the call did not run
    r = await env.step(call("print(2)"))  # the next, clean call runs
    assert "status: ok" in r.observation and pool.handed[0].codes == ["print(2)"]


async def test_trailing_text_default_ignores_the_tail(grader) -> None:
    env, pool = make_env(grader)
    await env.reset(options={"index": 0})
    r = await env.step(call("print(1)") + '"')
    assert r.observation.startswith("status: ok") and pool.handed[0].codes == ["print(1)"]


def test_trailing_text_needs_the_hermes_parser_built_here(grader) -> None:
    from agentenv.rollout.tool_calls import HermesToolCallParser

    env, _ = make_env(grader, trailing_text="error", tool_parser="qwen25")
    assert env.parser.trailing_text == "error"
    with pytest.raises(ConfigError, match="trailing_text"):
        make_env(grader, trailing_text="error", tool_parser="llama3_json")
    with pytest.raises(ConfigError, match="trailing_text"):
        make_env(grader, trailing_text="error", tool_parser=HermesToolCallParser())
    with pytest.raises(ConfigError, match="trailing_text"):
        make_env(grader, trailing_text="nope")


async def test_shared_pool_is_not_closed_and_close_is_idempotent(grader) -> None:
    env, pool = make_env(grader)
    await env.reset(options={"index": 0})
    await env.step(call("print(1)"))
    await env.close()
    await env.close()
    assert pool.released == pool.handed and not pool.closed


def test_config_errors() -> None:
    with pytest.raises(ConfigError):
        PythonToolEnv(problems=PROBLEMS, max_turns=0)
    with pytest.raises(ConfigError):
        PythonToolEnv(problems=[])
    with pytest.raises(DataError, match="math500"):
        PythonToolEnv(dataset="nope")


async def test_make_builds_it_from_the_registry(data_dir) -> None:
    env = agentenv.make("python_tool", dataset="aime24", sandbox_backend="process")
    assert isinstance(env, PythonToolEnv) and len(env.problems) == 30
    await env.close()
