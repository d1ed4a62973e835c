"""reasoning_gym/<FAMILY> and reasoning_gym_tool/<FAMILY> against reasoning-gym's own datasets and verifiers."""

from __future__ import annotations

import json

import pytest

import agentenv
from agentenv.adapters.reasoning_gym_env import ReasoningGymEnv, ReasoningGymToolEnv, families
from agentenv.checker import check_env
from agentenv.errors import ConfigError, DataError, EnvNotFound, ResetNeeded

reasoning_gym = pytest.importorskip("reasoning_gym", reason="reasoning-gym is not installed (a core dependency)")
CONFIG = {"min_value": 10, "max_value": 200, "min_numbers": 2, "max_numbers": 2}


def tool_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


async def test_items_tasks_and_rewards_are_reasoning_gyms() -> None:
    env = agentenv.make("reasoning_gym/lcm", seed=70, size=6, config=CONFIG)
    assert type(env) is ReasoningGymEnv and "lcm" in families()
    data = reasoning_gym.create_dataset("lcm", seed=70, size=6, **CONFIG)
    tasks = env.tasks()
    assert tasks.ids == tuple(f"lcm/{70 + i}" for i in range(6)) and set(tasks.kinds) == {"lcm"}
    assert "<answer>" in env.system_prompt
    for i in (0, 5):
        obs, info = await env.reset(options={"task": i})
        assert (obs, info["task_id"], info["ground_truth"]) == (data[i]["question"], tasks.ids[i], data[i]["answer"])
    r = await env.step(f"The LCM is <answer>{data[5]['answer']}</answer>.")
    assert (r.reward, r.terminated, r.truncated, r.info["task_id"]) == (1.0, True, False, "lcm/75")
    with pytest.raises(ResetNeeded):
        await env.step("<answer>1</answer>")
    # a wrong, a missing and a partial answer: the reward is the verifier's own score
    for reply, answer in (("<answer>7</answer>", "7"), ("no tags", None), ("<answer>x12</answer>", "x12")):
        _, info = await env.reset(options={"task": 2})
        r = await env.step(reply)
        assert r.info["extracted_answer"] == answer
        assert r.reward == data.score_answer(answer, data[2])
    assert r.reward == 0.0
    data_ba = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=2)
    env_ba = agentenv.make("reasoning_gym/basic_arithmetic", seed=3, size=2)
    await env_ba.reset(options={"task": 0})
    partial = f"<answer>{data_ba[0]['answer']}0</answer>"  # oracle inside a longer answer: partial credit
    r = await env_ba.step(partial)
    assert r.reward == data_ba.score_answer(f"{data_ba[0]['answer']}0", data_ba[0]) and 0.0 < r.reward < 1.0


async def test_seeds_give_disjoint_held_out_items_and_check_env_passes() -> None:
    train = agentenv.make("reasoning_gym/lcm", seed=0, size=50, config=CONFIG)
    held_out = agentenv.make("reasoning_gym/lcm", seed=1000, size=50, config=CONFIG)
    assert not set(train.tasks().ids) & set(held_out.tasks().ids)
    a = await train.reset(seed=11)
    assert a == await train.reset(seed=11) and a[1]["task_id"] in train.tasks().ids
    report = await check_env(agentenv.make("reasoning_gym/lcm", size=8), actions=["<answer>3</answer>"])
    assert report.checks[3] == "tasks_by_index" and report.checks[-1] == "close_twice"


def test_bad_family_config_and_index() -> None:
    with pytest.raises(EnvNotFound):
        agentenv.make("reasoning_gym/no_such_family")
    with pytest.raises(ConfigError, match="size must be >= 1"):
        agentenv.make("reasoning_gym/lcm", size=0)
    with pytest.raises(ConfigError, match="rejects config"):
        agentenv.make("reasoning_gym/lcm", config={"no_such_field": 1})
    with pytest.raises(ConfigError, match="does not take 'max_turn'"):
        agentenv.make("reasoning_gym/lcm", max_turn=3)
    with pytest.raises(DataError, match="out of range"):
        import asyncio

        asyncio.run(agentenv.make("reasoning_gym/lcm", size=3).reset(options={"task": 3}))


async def test_with_the_python_tool_graded_by_the_verifier() -> None:
    env = agentenv.make("reasoning_gym_tool/lcm", seed=70, size=6, config=CONFIG, sandbox_backend="process",
                        max_turns=3)
    assert type(env) is ReasoningGymToolEnv and env.tools and env.observation_role == "tool"
    data = reasoning_gym.create_dataset("lcm", seed=70, size=6, **CONFIG)
    numbers = data[4]["metadata"]["numbers"]
    try:
        obs, info = await env.reset(options={"task": 4})
        assert info["task_id"] == "lcm/74" and obs.startswith(data[4]["question"]) and "\\boxed{}" in obs
        r = await env.step(tool_call(f"import math\nprint(math.lcm(*{numbers!r}))"))
        assert (r.reward, r.terminated, r.truncated) == (0.0, False, False)
        assert r.observation.strip().endswith(data[4]["answer"])
        r = await env.step(f"The answer is \\boxed{{{r.observation.strip().split()[-1]}}}.")
        assert (r.reward, r.terminated, r.truncated) == (1.0, True, False)
        assert (r.info["task_id"], r.info["extracted_answer"], r.info["score"]) == ("lcm/74", data[4]["answer"], 1.0)
        await env.reset(options={"task": 1})
        r = await env.step("\\boxed{1}")
        assert (r.reward, r.terminated) == (data.score_answer("1", data[1]), True) and r.reward == 0.0
        await env.reset(options={"task": 1})
        for _ in range(3):
            r = await env.step(tool_call("print(1)"))
        assert (r.reward, r.terminated, r.truncated) == (0.0, False, True)  # max_turns tool replies
    finally:
        await env.close()
