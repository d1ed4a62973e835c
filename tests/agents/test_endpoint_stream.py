"""Streaming, ``tool_choice`` and ``logprobs`` on the OpenAI-compatible endpoint, through the real ``openai`` client.

The streamed reply is checked against the row the session recorded (the real engine on a tiny random
Llama); the tool-call paths use an engine that replies with scripted text, so that a call goes through
the endpoint exactly as written and its tokens can be followed into the trajectory.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from agentenv.agents import AgentEndpoint
from agentenv.agents.openai_format import ServedReply, text_pieces
from agentenv.agents.session import normalize_messages
from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.rollout.episode import RolloutConfig
from agentenv.rollout.tool_calls import get_tool_parser
from tests.agents.test_endpoint import assert_exact
from tests.agents.tiny import tiny_smollm_lm, tool_renderer
from tests.smollm_tokenizer import smollm_tokenizer

pytestmark = [pytest.mark.timeout(300)]

MODEL = "agentenv-policy"
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
ASK = [{"role": "user", "content": "What is 2 + 3?"}]


class ScriptedReplies:
    """Replies with the next scripted text: its ids under the real tokenizer, then end of turn.

    The i-th token's log-probability is -0.25 - 0.01 i.
    """

    def __init__(self, renderer, replies: list[str]) -> None:
        self.renderer, self.replies = renderer, list(replies)
        self.version, self.max_context_tokens = 0, 2048
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        self.prompts.append(list(prompt_ids))
        text = self.replies.pop(0)
        ids = [*self.renderer.tokenizer(text, add_special_tokens=False)["input_ids"], self.renderer.end_of_turn_id]
        ids = ids[: params.max_new_tokens]
        return GenerationOutput(ids, [-0.25 - 0.01 * i for i in range(len(ids))], [TokenSpan(len(ids), 0, 0)])


@pytest.fixture(scope="module")
def renderer():
    return tool_renderer()


async def served(engine, renderer, cfg, parser="hermes"):
    endpoint = AgentEndpoint(engine, renderer)
    await endpoint.start()
    session = endpoint.open_session(cfg, get_tool_parser(parser))
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=session.id, max_retries=0)
    return endpoint, session, client


def test_stream_chunks_join_to_the_body():
    """Hand-made reply: the deltas rebuild the message; finish, usage and [DONE] come last."""
    message = {"role": "assistant", "content": "Let me  add\nthem.", "reasoning_content": "two plus three",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]}
    reply = ServedReply(id="chatcmpl-x", created=7, model=MODEL, message=message, finish_reason="tool_calls",
                        prompt_tokens=11, completion_tokens=9, version=3, stream=True, include_usage=True)
    assert text_pieces("Let me  add\nthem.") == ["Let", " me", "  add", "\nthem."]
    chunks = reply.chunks()
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "two plus three"
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert calls[0] == {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add", "arguments": ""}}
    assert "".join(c["function"]["arguments"] for c in calls) == '{"a": 2, "b": 3}'
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls" and deltas[-1] == {}
    assert chunks[-1] == {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 7, "model": MODEL,
                          "system_fingerprint": "agentenv-v3", "choices": [],
                          "usage": {"prompt_tokens": 11, "completion_tokens": 9, "total_tokens": 20}}
    assert all(c["usage"] is None for c in chunks[:-1])
    events = reply.events()
    assert events[-1] == "data: [DONE]\n\n" and [json.loads(e[6:]) for e in events[:-1]] == chunks


async def test_a_streamed_reply_is_the_recorded_row_and_the_episode_goes_on(renderer):
    engine = TransformersEngine(tiny_smollm_lm(), smollm_tokenizer(), max_batch_size=4, seed=0)
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=6, max_total_tokens=200)
    endpoint, session, client = await served(engine, renderer, cfg)
    messages = list(ASK)
    for turn in range(2):
        stream = await client.chat.completions.create(model=MODEL, messages=messages, stream=True,
                                                      stream_options={"include_usage": True}, logprobs=True,
                                                      top_logprobs=2)
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        prompt, out = session.log[-1]
        assert chunks[0].choices[0].delta.role == "assistant"
        assert chunks[-1].usage.completion_tokens == len(out.token_ids)
        assert chunks[-1].usage.prompt_tokens == len(prompt)
        finish = chunks[-2].choices[0]
        assert finish.finish_reason in ("stop", "length")
        assert [e.logprob for e in finish.logprobs.content] == pytest.approx(out.logprobs, abs=0)
        assert "".join(e.token for e in finish.logprobs.content) == renderer.decode(out.token_ids, keep_special=True)
        assert out.top_logprobs is not None  # the engine's alternatives, as texts, on the wire
        assert [[(a.token, a.logprob) for a in e.top_logprobs] for e in finish.logprobs.content] == [
            [(renderer.decode([i], keep_special=True), lp) for i, lp in top] for top in out.top_logprobs]
        assert all(len(e.top_logprobs) == 2 for e in finish.logprobs.content)
        reply = {"role": "assistant", "content": text}
        assert normalize_messages([reply]) == session._seen[-1:]  # the streamed message is the recorded one
        messages += [reply, {"role": "user", "content": f"more {turn}"}]
    assert session.info["turns"] == 2 and session.info["history_rewrites"] == 0 and len(session.samples) == 1
    assert_exact(session, session.samples)
    async with httpx.AsyncClient(base_url=endpoint.base_url) as raw:  # the wire: an event stream
        r = await raw.post("/chat/completions", headers={"Authorization": f"Bearer {session.id}"},
                           json={"model": MODEL, "messages": ASK, "stream": True})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = r.text.split("\n\n")
        assert events[-2:] == ["data: [DONE]", ""] and all(e.startswith("data: {") for e in events[:-2])
    await client.close()
    await endpoint.close()
    await engine.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_named_tool_choice_forces_the_call_into_the_trajectory(renderer, stream):
    """The forced opening is environment tokens of the row, the rest the policy's; the call reaches the agent."""
    continuation = '{"a": 2, "b": 3}}\n</tool_call>'
    engine = ScriptedReplies(renderer, [continuation, "The sum is 5."])
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=400)
    endpoint, session, client = await served(engine, renderer, cfg)
    choice = {"type": "function", "function": {"name": "add"}}
    if stream:
        async with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[ADD], tool_choice=choice) as s:
            reply = await s.get_final_completion()
    else:
        reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[ADD], tool_choice=choice)
    (call,) = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    opening = renderer.tokenizer('<tool_call>\n{"name": "add", "arguments": ', add_special_tokens=False)["input_ids"]
    row, (prompt, out) = session.traj, session.log[0]
    assert prompt[-len(opening):] == opening and engine.prompts[0] == prompt  # the engine conditioned on it
    start = len(prompt) - len(opening)
    assert row.loss_mask[start: len(prompt)] == [0] * len(opening)
    assert row.loss_mask[len(prompt): len(prompt) + len(out.token_ids)] == [1] * len(out.token_ids)
    assert renderer.decode(row.token_ids[start:]) == '<tool_call>\n{"name": "add", "arguments": ' + continuation
    assert session.info["forced_call_openings"] == 1 and session.info["tool_calls"] == 1
    # the agent runs the tool and asks again: the row extends, nothing is forced any more
    messages = [*ASK, reply.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = await client.chat.completions.create(model=MODEL, messages=messages, tools=[ADD])
    assert second.choices[0].message.content == "The sum is 5." and second.choices[0].finish_reason == "stop"
    assert session.info["history_rewrites"] == 0 and len(session.samples) == 1
    assert session.info["forced_call_openings"] == 1
    await client.close()
    await endpoint.close()


async def test_required_lets_the_model_name_the_tool_and_none_parses_no_call(renderer):
    written = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>'
    engine = ScriptedReplies(renderer, ['add", "arguments": {"a": 1, "b": 1}}\n</tool_call>', written])
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=400)
    endpoint, session, client = await served(engine, renderer, cfg)
    required = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[ADD], tool_choice="required")
    (call,) = required.choices[0].message.tool_calls
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 1}
    opening = renderer.tokenizer('<tool_call>\n{"name": "', add_special_tokens=False)["input_ids"]
    assert engine.prompts[0][-len(opening):] == opening
    other = endpoint.open_session(cfg, get_tool_parser("hermes"))
    plain = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=other.id, max_retries=0)
    none = await plain.chat.completions.create(model=MODEL, messages=ASK, tools=[ADD], tool_choice="none")
    message = none.choices[0].message
    assert message.tool_calls is None and message.content == written and none.choices[0].finish_reason == "stop"
    assert other.info["tool_calls"] == 0 and other.info["forced_call_openings"] == 0
    assert engine.prompts[1] == list(other.traj.token_ids[: len(engine.prompts[1])])  # nothing forced
    for c in (client, plain):
        await c.close()
    await endpoint.close()


@pytest.mark.parametrize("stream", [False, True])
async def test_n_choices_are_samples_of_their_own_and_the_history_picks_the_line(renderer, stream):
    """Three choices of one request: three rows sharing the prompt; the agent goes on with the second.

    Streamed, the openai client's own accumulator rebuilds the three choices from their indexed chunks.
    """
    replies = ["Maybe 4.", "It is 5.", "Six?", "Yes, 5."]
    engine = ScriptedReplies(renderer, replies)
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=400)
    endpoint, session, client = await served(engine, renderer, cfg)
    if stream:
        async with client.chat.completions.stream(model=MODEL, messages=ASK, n=3, logprobs=True,
                                                  stream_options={"include_usage": True}) as s:
            first = await s.get_final_completion()
    else:
        first = await client.chat.completions.create(model=MODEL, messages=ASK, n=3, logprobs=True)
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.message.content for c in first.choices] == replies[:3]
    assert all(c.logprobs.content[0].logprob == -0.25 for c in first.choices)
    assert first.usage.completion_tokens == sum(len(out.token_ids) for _, out in session.log)
    rows = list(session.samples)
    prompt = session.log[0][0]
    assert len(rows) == 3 and len({r.id for r in rows}) == 3 and engine.prompts == [prompt] * 3
    for row, (_, out) in zip(rows, session.log, strict=True):  # each row: the shared prompt, then its own reply
        assert row.token_ids == prompt + out.token_ids and row.loss_mask == [0] * len(prompt) + [1] * len(out.token_ids)
    messages = [*ASK, first.choices[1].message.model_dump(exclude_none=True), {"role": "user", "content": "Sure?"}]
    second = await client.chat.completions.create(model=MODEL, messages=messages)
    assert second.choices[0].message.content == "Yes, 5."
    assert session.traj is rows[1] and len(session.samples) == 3  # the second choice's row goes on
    assert renderer.decode(rows[1].token_ids).endswith("Sure?\nassistant\nYes, 5.")
    assert rows[0].token_ids == prompt + session.log[0][1].token_ids  # the others stay as they were
    assert session.info["history_rewrites"] == 0 and session.info["extra_choices"] == 2
    assert session.info["turns"] == 2
    await client.close()
    await endpoint.close()


async def test_bad_options_are_refused_and_nothing_is_recorded(renderer):
    engine = ScriptedReplies(renderer, ["fine"])
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=16, max_total_tokens=400)
    endpoint, session, client = await served(engine, renderer, cfg)

    async def refused(code, message, **kw):
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(**{"model": MODEL, "messages": ASK, **kw})
        assert err.value.code == code and message in str(err.value), err.value
        assert session.samples[1:] == [] and not engine.prompts  # the engine was never asked

    await refused("invalid_value", "n must be an integer in [1, 8], got 9", n=9)
    await refused("invalid_value", "top_logprobs needs logprobs=true", top_logprobs=3)
    await refused("invalid_value", "top_logprobs must be an integer in [0, 20]", logprobs=True, top_logprobs=21)
    await refused("invalid_value", "not among the request's tools (add)", tools=[ADD],
                  tool_choice={"type": "function", "function": {"name": "multiply"}})
    await refused("invalid_value", "needs tools", tool_choice="required")
    await refused("invalid_value", "tool_choice must be", tools=[ADD], tool_choice="always")
    await refused("invalid_value", "stream must be a boolean", extra_body={"stream": "yes"})
    with pytest.raises(openai.InternalServerError) as err:  # an engine without alternatives: nothing recorded
        await client.chat.completions.create(model=MODEL, messages=ASK, logprobs=True, top_logprobs=2)
    assert err.value.code == "engine_error" and "ScriptedReplies" in str(err.value)
    assert session.samples[1:] == [] and len(engine.prompts) == 1 and session.info["turns"] == 0
    engine.replies.insert(0, "fine")
    engine.prompts.clear()
    mistral = endpoint.open_session(cfg, get_tool_parser("mistral"))
    forced = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=mistral.id, max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        await forced.chat.completions.create(model=MODEL, messages=ASK, tools=[ADD], tool_choice="required")
    assert err.value.code == "unsupported_value" and "MistralToolCallParser" in str(err.value)
    assert not mistral.samples and not engine.prompts
    ok = await client.chat.completions.create(model=MODEL, messages=ASK, stream=False)  # the session still serves
    assert ok.choices[0].message.content == "fine" and len(session.samples) == 1
    for c in (client, forced):
        await c.close()
    await endpoint.close()
