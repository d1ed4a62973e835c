"""The OpenAI-compatible endpoint on loopback, driven by the real ``openai`` package and the real engine.

The policy is a tiny random Llama over SmolLM2's tokenizer with the shipped tool template; the agent
is ``tests/agents/calc_agent.py`` (its own loop, an ``add`` tool, 3 requests an episode).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import openai
import pytest

from agentenv.agents import AgentEndpoint, AgentEnv
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.errors import ConfigError
from agentenv.rollout.episode import RolloutConfig, run_episode_samples
from agentenv.rollout.tool_calls import get_tool_parser
from tests.agents import calc_agent
from tests.agents.tiny import tiny_smollm_lm, tool_renderer
from tests.smollm_tokenizer import smollm_tokenizer

pytestmark = [pytest.mark.timeout(300)]

CFG = RolloutConfig(max_turns=8, max_new_tokens_per_turn=4, max_total_tokens=400)
SCRIPT = Path(calc_agent.__file__)


@pytest.fixture(scope="module")
def renderer():
    return tool_renderer()


@pytest.fixture
async def engine():
    eng = TransformersEngine(tiny_smollm_lm(), smollm_tokenizer(), max_batch_size=8, seed=0)
    yield eng
    await eng.close()


def assert_exact(session, samples):
    """Every engine call's prompt + output is a prefix of its sample; the policy tokens are exactly the outputs."""
    rows = iter(samples)
    row = next(rows)
    outputs: dict[str, list] = {}
    for prompt, out in session.log:
        if row.token_ids[: len(prompt)] != prompt:
            row = next(rows)  # a new sample starts with this request
        assert row.token_ids[: len(prompt) + len(out.token_ids)] == prompt + out.token_ids
        assert row.loss_mask[len(prompt): len(prompt) + len(out.token_ids)] == [1] * len(out.token_ids)
        assert row.behaviour_logprobs[len(prompt): len(prompt) + len(out.token_ids)] == out.logprobs
        outputs.setdefault(row.id, []).append(out)
    for s in samples:
        sampled = [t for out in outputs[s.id] for t in out.token_ids]
        assert [t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m] == sampled
        assert sum(seg.num_tokens for seg in s.segments) == len(sampled)


@pytest.mark.parametrize("agent", ["callable", "script", "command"])
async def test_an_openai_agent_plays_an_episode_with_exact_tokens(engine, renderer, agent):
    if agent == "callable":
        env = AgentEnv(calc_agent.solve, calc_agent.score, calc_agent.TASKS)
    else:  # the unmodified program: OpenAI() from the environment, its own model name
        program = str(SCRIPT) if agent == "script" else ["/usr/bin/env", sys.executable, str(SCRIPT)]
        env = AgentEnv(program, "tests.agents.calc_agent:score", "tests.agents.calc_agent:TASKS",
                       models=("gpt-4o-mini",))
    assert env.tasks().ids == ("add-2-3", "add-4-5", "add-7-1", "add-6-6")
    samples = await run_episode_samples(env, engine, renderer, CFG, seed=1)  # the collector's call
    session_log = env.endpoint  # the endpoint stays up for the env's next episode
    assert session_log is not None and not session_log.sessions  # the episode's session is closed
    assert len(samples) == 1
    traj = samples[0]
    assert traj.status == "completed" and traj.task_id == "add-4-5", traj.info.get("error")
    assert traj.info["turns"] == calc_agent.TURNS == traj.info["agent_requests"]
    assert traj.info["history_rewrites"] == 0 and traj.info["prefix_violations"] == 0
    assert traj.info["sampling_overrides"] == calc_agent.TURNS  # it asked for temperature 0.7
    assert traj.reward == calc_agent.score(calc_agent.TASKS[1], traj.info["agent_output"])
    assert 0 < traj.num_policy_tokens <= 4 * calc_agent.TURNS and len(env.last_session.log) == calc_agent.TURNS
    assert_exact(env.last_session, samples)
    assert [s.version for s in traj.segments] == [0] * len(traj.segments)
    await env.close()
    await env.close()


async def test_a_command_agent_gets_the_endpoint_in_its_environment_and_fails_clearly(engine, renderer):
    """The command runs as given (any program); a failing one is an error episode naming the command."""
    echo = AgentEnv(["/bin/sh", "-c", 'printf "%s|%s|%s" "$AGENTENV_MODEL" "$AGENTENV_TASK" "$OPENAI_BASE_URL"'],
                    lambda task, output: float(output.startswith("gpt-4o-mini|")), ["t0", "t1"],
                    models=("gpt-4o-mini",))
    (traj,) = await run_episode_samples(echo, engine, renderer, CFG, seed=1)
    model, task, url = traj.info["agent_output"].split("|")
    assert (model, task, traj.reward, traj.status) == ("gpt-4o-mini", '"t1"', 1.0, "completed")
    assert url == echo.endpoint.base_url and url.startswith("http://127.0.0.1:")
    failing = AgentEnv(["/bin/sh", "-c", "echo broken >&2; exit 3"], lambda task, output: 1.0, ["t0"])
    (traj,) = await run_episode_samples(failing, engine, renderer, CFG, seed=0)
    assert traj.status == "error" and "exited with status 3: broken" in traj.info["error"]
    assert "/bin/sh -c" in traj.info["error"]
    with pytest.raises(ConfigError, match="the program 'no-such-agent-program' is not found"):
        AgentEnv(["no-such-agent-program", "x.py"], lambda task, output: 1.0, ["t0"])
    with pytest.raises(ConfigError, match="non-empty list of strings"):
        AgentEnv([], lambda task, output: 1.0, ["t0"])
    for env in (echo, failing):
        await env.close()


async def test_token_rows_match_the_engine_and_updates_split_segments(engine, renderer):
    """An async agent; a weight update lands between its requests: the later reply's segment has version 1."""
    endpoint = AgentEndpoint(engine, renderer)
    await endpoint.start()
    session = endpoint.open_session(CFG, get_tool_parser("hermes"))
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=session.id, max_retries=0)
    models = await client.models.list()
    assert [m.id for m in models.data] == ["agentenv-policy"]
    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    for turn in range(3):
        reply = await client.chat.completions.create(model="agentenv-policy", messages=messages)
        assert reply.usage.completion_tokens == len(session.log[-1][1].token_ids)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
        if turn == 0:
            await engine.update_weights(tiny_smollm_lm(seed=1).state_dict(), 1)
    endpoint.close_session(session.id)
    traj = session.traj
    assert_exact(session, session.samples)
    assert len(session.samples) == 1 and [s.version for s in traj.segments] == [0, 1, 1][: len(traj.segments)]
    assert {s.version for s in traj.segments} == {0, 1}
    assert traj.segments[0].num_tokens == len(session.log[0][1].token_ids)
    await client.close()
    await endpoint.close()


async def test_a_history_rewrite_starts_a_new_sample_and_is_counted(engine, renderer):
    env = AgentEnv(calc_agent.forgetful, calc_agent.score, calc_agent.TASKS)
    samples = await run_episode_samples(env, engine, renderer, CFG, seed=0)
    assert len(samples) == calc_agent.TURNS
    assert_exact(env.last_session, samples)
    for i, s in enumerate(samples):
        assert s.info["history_rewrites"] == calc_agent.TURNS - 1
        assert s.info["sample"] == i and s.info["samples"] == calc_agent.TURNS and s.status == "completed"
        # each sample is the template's rendering of what the agent sent, then the reply sampled
        assert s.token_ids[: s.prompt_length] == renderer.conversation_from(
            [{"role": "system", "content": "Use the add tool, then give the sum."},
             {"role": "user", "content": "What is 2 + 3?" if i == 0 else f"Check it once more (turn {i})."}],
            tools=calc_agent.TOOLS).prompt_ids
        # the reply, then (a reply cut by max_tokens) the end-of-turn token that closes it, as an env token
        assert s.token_ids[s.prompt_length + s.num_policy_tokens:] in ([], [renderer.end_of_turn_id])
    await env.close()


async def test_bad_input_gets_typed_errors_and_the_record_stays_consistent(engine, renderer):
    endpoint = AgentEndpoint(engine, renderer)
    await endpoint.start()
    small = RolloutConfig(max_turns=8, max_new_tokens_per_turn=4, max_total_tokens=30)
    session = endpoint.open_session(small, get_tool_parser("hermes"))
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=session.id, max_retries=0)
    ask = [{"role": "user", "content": "hi"}]
    first = await client.chat.completions.create(model="agentenv-policy", messages=ask)
    before = list(session.traj.token_ids)

    async def refused(kind, code, **kw):
        with pytest.raises(kind) as err:
            await client.chat.completions.create(**{"model": "agentenv-policy", "messages": ask, **kw})
        assert err.value.code == code, err.value
        assert session.traj.token_ids == before and len(session.samples) == 1  # nothing was recorded

    await refused(openai.NotFoundError, "model_not_found", model="gpt-5")
    await refused(openai.BadRequestError, "invalid_schema", tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {"type": 12}}}}}])
    await refused(openai.BadRequestError, "invalid_value", tools=[{"type": "function"}])
    await refused(openai.BadRequestError, "invalid_value", messages=[{"role": "robot", "content": "x"}])
    ghost = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key="sess-nope", max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        await ghost.chat.completions.create(model="agentenv-policy", messages=ask)
    assert err.value.code == "session_not_found"
    async with httpx.AsyncClient(base_url=endpoint.base_url) as raw:
        r = await raw.post("/chat/completions", content=b"{not json", headers={"Authorization": f"Bearer {session.id}"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = await raw.post("/chat/completions", json={"model": "agentenv-policy", "messages": ask})
        assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
        assert (await raw.get("/nothing")).json()["error"]["code"] == "not_found"
        assert (await raw.get("/models/gpt-5")).json()["error"]["code"] == "model_not_found"
    # the history goes on: a max_tokens beyond what the episode has left is refused, then served within it
    ask = [*ask, first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="agentenv-policy", messages=ask, max_tokens=1000)
    assert err.value.code == "max_tokens_exceeded" and "tokens this episode has left" in str(err.value)
    grown = list(session.traj.token_ids)  # the new message was rendered once, the retry reuses it
    second = await client.chat.completions.create(model="agentenv-policy", messages=ask, max_tokens=2)
    assert second.usage.completion_tokens <= 2 and len(session.log) == 2
    assert session.traj.token_ids[: len(grown)] == grown and session.info["history_rewrites"] == 0
    assert_exact(session, session.samples)
    # after the episode: typed, and the server still serves the others
    endpoint.close_session(session.id)
    with pytest.raises(openai.ConflictError) as err:
        await client.chat.completions.create(model="agentenv-policy", messages=ask)
    assert err.value.code == "session_closed"
    other = endpoint.open_session(small, get_tool_parser("hermes"))
    ok = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=other.id, max_retries=0)
    assert (await ok.chat.completions.create(model="agentenv-policy", messages=ask[:1])).choices[0].message
    for c in (client, ghost, ok):
        await c.close()
    await endpoint.close()


def test_a_reply_with_a_tool_call_becomes_openai_tool_calls(renderer):
    from agentenv.agents.session import AgentSession, normalize_messages

    session = AgentSession("sess-0123456789", None, renderer, CFG, get_tool_parser("hermes"), lambda: 0)
    session.info["turns"] = 1
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    message, finish = session._message(text, "end_of_turn")
    assert finish == "tool_calls" and message["content"] == "Let me add."
    (call,) = message["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'} and call["id"] == "call_23456789_1_0"
    # what the openai client sends back normalizes to the same message (an extension, not a rewrite)
    back = openai.types.chat.ChatCompletionMessage.model_validate(message).model_dump(exclude_none=True)
    assert normalize_messages([back]) == normalize_messages([message])
    bad, finish = session._message('<tool_call>\n{"name": "add", "arguments": [1]}\n</tool_call>', "end_of_turn")
    assert finish == "stop" and "tool_calls" not in bad and "<tool_call>" in bad["content"]


async def test_concurrent_sessions_do_not_mix(engine, renderer):
    endpoint = AgentEndpoint(engine, renderer)
    await endpoint.start()

    async def one(k):
        s = endpoint.open_session(CFG, get_tool_parser("hermes"))
        c = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=s.id, max_retries=0)
        msgs = [{"role": "user", "content": f"task {k}"}]
        for _ in range(2):
            r = await c.chat.completions.create(model="agentenv-policy", messages=msgs)
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
        await c.close()
        endpoint.close_session(s.id)
        return s

    sessions = await asyncio.gather(*(one(k) for k in range(6)))
    for s in sessions:
        assert len(s.samples) == 1 and s.info["turns"] == 2 and s.info["history_rewrites"] == 0
        assert_exact(s, s.samples)
    await endpoint.close()
