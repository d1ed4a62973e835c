"""openenv/<NAME> against real OpenEnv servers: openenv-core's own create_app, in its own Python environment.

The servers (tests/adapters/openenv_server.py: a typed JSON action and a one-string action) run under
.venv-openenv's interpreter (scripts/install_openenv.sh), on loopback; agentenv's side imports nothing
of OpenEnv.
"""

from __future__ import annotations

import asyncio
import json

import pytest

import agentenv
from agentenv.adapters.openenv_env import OpenEnvEnv, action_field, observation_text, parse_action
from agentenv.checker import check_env
from agentenv.errors import ConfigError, RemoteEnvError, ResetNeeded
from agentenv.rollout.collector import failure_reason
from agentenv.rollout.episode import RolloutConfig, run_episode
from tests.adapters import openenv_launch
from tests.fakes import CharRenderer, ScriptedEngine

pytest.importorskip("websockets", reason="the OpenEnv client needs websockets (pip install 'agentenv[openenv]')")

pytestmark = [pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def servers():
    """``{"guess": url, "echo": url}``: the two OpenEnv servers, up (their /health answers) within 90 s."""
    if not openenv_launch.PYTHON.is_file():
        pytest.skip(f"no OpenEnv server environment at {openenv_launch.PYTHON} (bash scripts/install_openenv.sh; "
                    f"scripts/install.sh --all makes it)")
    procs, urls = openenv_launch.start(("guess", "echo"))
    yield urls
    openenv_launch.stop(procs)


async def test_a_typed_action_is_the_reply_as_json_and_the_rewards_are_the_servers(servers) -> None:
    env = agentenv.make("openenv/guess", url=servers["guess"])
    assert type(env) is OpenEnvEnv and len(env.tasks()) == 1000 and env.tasks().ids[5] == "guess/seed-5"
    obs, info = await env.reset(options={"task": 5})  # the server's target: 5 % 16 + 1 = 6
    assert json.loads(obs) == {"feedback": "Guess a number in [1, 16].", "guesses_left": 4}
    assert info == {"task_id": "guess/seed-5", "seed": 5}
    assert env.system_prompt.startswith("Each of your replies is one action: a JSON object of this schema.")
    assert '"guess"' in env.system_prompt and "integer" in env.system_prompt  # the server's own schema
    r = await env.step('{"guess": 3}')
    assert (json.loads(r.observation), r.reward, r.terminated, r.truncated) == (
        {"feedback": "higher", "guesses_left": 3}, 0.0, False, False)
    r = await env.step('It must be {"guess": 6}')  # the object inside the reply is the action
    assert (json.loads(r.observation)["feedback"], r.reward, r.terminated) == ("correct", 1.0, True)
    with pytest.raises(ResetNeeded):
        await env.step('{"guess": 6}')
    obs, _ = await env.reset(options={"task": 0})  # the same session plays the next episode
    assert (await env.step('{"guess": 1}')).reward == 1.0
    await env.close()


async def test_a_reply_that_is_no_valid_action_is_the_policys_mistake(servers) -> None:
    """Not JSON, or JSON the server's schema refuses: an error observation, reward 0, the episode goes on."""
    async with agentenv.make("openenv/guess", url=servers["guess"]) as env:
        await env.reset(options={"task": 2})  # target 3
        r = await env.step("three")
        assert r.observation == "Invalid action: your reply must be one JSON object (the action), and it holds none."
        assert (r.reward, r.terminated) == (0.0, False) and "action_error" in r.info
        r = await env.step('{"guess": "three"}')  # the server's VALIDATION_ERROR
        assert r.observation.startswith("Invalid action: Invalid message") and "int" in r.observation
        assert (r.reward, r.terminated) == (0.0, False)
        r = await env.step('{"guess": 3}')  # refused actions did not spend a guess on the server
        assert (json.loads(r.observation), r.reward) == ({"feedback": "correct", "guesses_left": 3}, 1.0)
        # the server's 4 guesses count only actions it takes: 3 refused replies in a row cut the episode
        await env.reset(options={"task": 2})
        steps = [await env.step(reply) for reply in ("no", '{"guess": 1}', "no", "no", "no")]
        assert [(r.terminated, r.truncated) for r in steps] == [(False, False)] * 4 + [(False, True)]
        with pytest.raises(ResetNeeded):
            await env.step('{"guess": 3}')


async def test_a_one_string_action_takes_the_reply_whole(servers) -> None:
    async with agentenv.make("openenv/echo", url=servers["echo"]) as env:
        assert env.system_prompt is None
        obs, _ = await env.reset(options={"task": 7})
        assert obs == "ready (seed 7)" and env.system_prompt is None  # one field: its text; no schema to show
        r = await env.step('hello {"not": "json"}')
        assert (r.observation, r.reward, r.terminated) == ('hello {"not": "json"}', pytest.approx(2.1), False)


async def test_failures_outside_the_policy_raise_and_the_next_reset_recovers(servers) -> None:
    env = OpenEnvEnv("guess", url=servers["guess"])
    await env.reset(options={"task": 1})
    with pytest.raises(RemoteEnvError, match="EXECUTION_ERROR: the guessing machine broke"):
        await env.step('{"guess": 13}')  # the server's environment raised: never a reward of 0
    await env.reset(options={"task": 1})
    assert (await env.step('{"guess": 2}')).reward == 1.0
    await env.close()
    full = [OpenEnvEnv("guess", url=servers["guess"]) for _ in range(5)]  # the server holds 4 sessions
    for env in full[:4]:
        await env.reset(options={"task": 0})
    with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED.*lower run.concurrency") as err:
        await full[4].reset(options={"task": 0})
    assert err.value.kind == "capacity"
    await full[0].close()  # a session ends: there is room again, once the server has let it go
    for attempt in range(50):
        try:
            await full[4].reset(options={"task": 0})
            break
        except RemoteEnvError as exc:
            assert exc.kind == "capacity" and attempt < 49
            await asyncio.sleep(0.1)
    for env in full[1:]:
        await env.close()
    gone = OpenEnvEnv("guess", url=f"http://127.0.0.1:{openenv_launch.free_port()}", timeout_s=5)
    with pytest.raises(RemoteEnvError, match="schema failed"):
        await gone.reset(options={"task": 0})


async def test_an_episode_through_the_rollout_loop(servers) -> None:
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=40, max_total_tokens=2000)
    async with agentenv.make("openenv/guess", url=servers["guess"]) as env:
        traj = await run_episode(env, ScriptedEngine(['{"guess": 8}', "four?", '{"guess": 4}']), CharRenderer(),
                                 cfg, seed=0, options={"task": 3})
        assert traj.reward == 1.0 and traj.info["turns"] == 3 and traj.task_id == "guess/seed-3"
        text = CharRenderer().decode(traj.token_ids)
        assert '"feedback": "lower"' in text and "Invalid action" in text
        # an infrastructure failure ends the episode as failed (the collector replays it), never scored 0
        failed = await run_episode(env, ScriptedEngine(['{"guess": 13}']), CharRenderer(), cfg, seed=0,
                                   options={"task": 3})
        assert failed.status == "error" and "EXECUTION_ERROR" in failure_reason(failed)


async def test_passes_agentenvs_contract_checker(servers) -> None:
    report = await check_env(agentenv.make("openenv/guess", url=servers["guess"]),
                             actions=['{"guess": 1}', '{"guess": 2}'])
    assert "tasks_by_index" in report.checks and report.checks[-1] == "close_twice" and not report.notes


async def test_bad_configuration_is_refused_with_what_is_wrong(servers) -> None:
    with pytest.raises(ConfigError, match="env.kwargs.url"):
        agentenv.make("openenv/guess")
    with pytest.raises(ConfigError, match="http"):
        OpenEnvEnv("guess", url="ftp://example")
    env = OpenEnvEnv("guess", url=servers["guess"], action_field="answer")
    with pytest.raises(ConfigError, match=r"no field 'answer' \(its fields: \['guess', 'metadata'\]\)"):
        await env.reset(options={"task": 0})
    with pytest.raises(ConfigError, match="max_refused must be >= 1"):
        OpenEnvEnv("guess", url=servers["guess"], max_refused=0)
    with pytest.raises(ConfigError, match="out of range"):
        await OpenEnvEnv("guess", url=servers["guess"], num_tasks=3).reset(options={"task": 3})


def test_the_mapping_pieces() -> None:
    assert action_field({"properties": {"message": {"type": "string"}, "metadata": {"type": "object"}}}) == "message"
    assert action_field({"properties": {"guess": {"type": "integer"}}}) is None
    assert action_field({"properties": {"a": {"type": "string"}, "b": {"type": "string"}}}) is None
    assert observation_text({"text": "hi"}) == "hi" and observation_text({"n": 3}) == "3"
    assert observation_text({"b": 1, "a": "x"}) == '{"a": "x", "b": 1}'
    assert observation_text({"b": 1, "a": "x"}, "a") == "x"
    with pytest.raises(RemoteEnvError, match="no field 'c'"):
        observation_text({"a": 1}, "c")
    assert parse_action('say {"x": {"y": 1}} ok') == {"x": {"y": 1}}
    assert parse_action("[1]").startswith("your reply must be one JSON object")
    assert parse_action("{oops}").startswith("the action is not valid JSON")
