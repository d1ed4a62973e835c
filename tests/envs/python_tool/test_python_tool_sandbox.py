"""PythonToolEnv with the real process sandbox: state persists, and bad input ends cleanly or goes on."""

from __future__ import annotations

import json

import pytest

from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.grading import Grader

PROBLEMS = [
    MathProblem("t/0", "Compute 2^10.", "1024", "t"),
    MathProblem("t/1", "Half of 1?", "\\frac{1}{2}", "t"),
]


def call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


@pytest.fixture(scope="module")
def grader():
    with Grader(workers=1) as g:
        yield g


@pytest.fixture
async def env(grader):
    e = PythonToolEnv(
        problems=PROBLEMS,
        sandbox_backend="process",
        sandbox_timeout_s=2.0,
        grader=grader,
        max_turns=6,
        max_output_chars=2000,
    )
    yield e
    await e.close()


async def test_state_persists_and_correct_answer_pays(env) -> None:
    await env.reset(options={"index": 0})
    r = await env.step(call("x = 2 ** 10"))
    assert "status: ok" in r.observation and "no output" in r.observation
    r = await env.step(call("print(x)"))
    assert r.observation == "status: ok\nstdout:\n1024"
    assert r.info["sandbox_backend"] == "process" and r.info["sandbox_s"] > 0
    r = await env.step("\\boxed{1024}")
    assert r.reward == 1.0 and r.terminated


async def test_new_episode_gets_a_fresh_sandbox(env) -> None:
    await env.reset(options={"index": 0})
    await env.step(call("secret = 5"))
    await env.reset(options={"index": 0})
    r = await env.step(call("print(secret)"))
    assert "status: error" in r.observation and "NameError" in r.observation


async def test_bad_input_each_episode_goes_on_or_ends_cleanly(env) -> None:
    await env.reset(options={"index": 1})
    # malformed JSON, unknown tool, missing closing tag, empty code: error observations
    r = await env.step('<tool_call>{"name": "python", "arguments": {code: 1}}</tool_call>')
    assert "error: malformed tool call" in r.observation and not r.terminated
    r = await env.step('<tool_call>{"name": "bash", "arguments": {"code": "ls"}}</tool_call>')
    assert "unknown tool 'bash'" in r.observation and not r.terminated
    r = await env.step('<tool_call>{"name": "python", "arguments": {"code": "print(7)"}} and more text')
    assert "not closed" in r.observation and not r.terminated
    r = await env.step(call(""))
    assert "empty" in r.observation and not r.terminated
    # huge output is cut
    r = await env.step(call("print('y' * 1_000_000)"))
    assert "status: ok" in r.observation and len(r.observation) < 3000 and "cut" in r.observation
    # an infinite loop times out; the episode goes on with a fresh worker
    r = await env.step(call("while True:\n    pass"))
    assert r.observation.startswith("status: timeout") and "restarted" in r.observation
    assert r.info["tool_errors"] == 5 and r.truncated  # 6th turn: max_turns reached


async def test_sys_exit_and_answer_after_it(env) -> None:
    await env.reset(options={"index": 1})
    r = await env.step(call("v = 1\nimport sys\nsys.exit(3)"))
    assert r.observation.startswith("status: error") and "SystemExit" in r.observation and not r.terminated
    r = await env.step(call("print(v / 2)"))  # the worker survived with its state
    assert r.observation == "status: ok\nstdout:\n0.5"
    r = await env.step("\\boxed{0.5}")
    assert r.reward == 1.0 and r.terminated


async def test_unparsable_answer_scores_zero(env) -> None:
    await env.reset(options={"index": 0})
    r = await env.step("\\boxed{\\frac{}{}}")
    assert r.terminated and r.reward == 0.0 and r.info["extracted_answer"] == "\\frac{}{}"
    assert r.info["grade_reason"] == "unparsable answer"
