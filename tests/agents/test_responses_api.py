"""The Responses API (``POST /v1/responses``) through the real ``openai`` client: plain, streamed, refused.

An engine that replies with scripted text lets a function call travel through the endpoint as
written; the rows are the chat-completions session's, so the same exactness checks apply.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from agentenv.agents.responses_api import chat_messages
from agentenv.rollout.episode import RolloutConfig
from tests.agents.test_endpoint import assert_exact
from tests.agents.test_endpoint_stream import MODEL, ScriptedReplies, served
from tests.agents.tiny import tool_renderer

pytestmark = [pytest.mark.timeout(120)]

ADD = {"type": "function", "name": "add", "description": "Add two integers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}
CFG = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=600)


def test_input_items_become_the_chat_messages_they_mean():
    body = {"instructions": "Be brief.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is "},
                                     {"type": "input_text", "text": "2+3?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Adding."}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 3}'},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 0, "b": 0}'},
        {"type": "function_call_output", "call_id": "c1", "output": "5"},
        {"type": "function_call_output", "call_id": "c2", "output": {"value": 0}}]}
    assert chat_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": "Adding.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 0, "b": 0}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"value": 0}'}]
    assert chat_messages({"input": "hi"}) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_function_call_round_trip_extends_one_row(stream):
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, ['{"a": 2, "b": 3}}\n</tool_call>', "The sum is 5."])
    endpoint, session, client = await served(engine, renderer, CFG)
    ask = {"model": MODEL, "input": "What is 2 + 3?", "instructions": "Use the add tool.", "tools": [ADD]}
    if stream:
        async with client.responses.stream(**ask, tool_choice={"type": "function", "name": "add"}) as s:
            first = await s.get_final_response()
    else:
        first = await client.responses.create(**ask, tool_choice={"type": "function", "name": "add"})
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and call.name == "add" and call.arguments == '{"a": 2, "b": 3}'
    assert first.usage.output_tokens == len(session.log[0][1].token_ids)
    history = [{"role": "user", "content": "What is 2 + 3?"}, *(i.model_dump(exclude_none=True) for i in first.output),
               {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    second = await client.responses.create(**{**ask, "input": history})
    assert second.output_text == "The sum is 5." and second.status == "completed"
    assert session.info["history_rewrites"] == 0 and session.info["forced_call_openings"] == 1
    assert len(session.samples) == 1 and session.info["tool_calls"] == 1
    assert_exact(session, session.samples)
    await client.close()
    await endpoint.close()


async def test_the_event_stream_is_typed_and_ordered():
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, ["Five, I think."])
    endpoint, session, _ = await served(engine, renderer, CFG)
    async with httpx.AsyncClient(base_url=endpoint.base_url) as raw:
        r = await raw.post("/responses", headers={"Authorization": f"Bearer {session.id}"},
                           json={"model": MODEL, "input": "What is 2 + 3?", "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in r.text.split("\n\n") if b]
    kinds = [b.split("\n")[0].removeprefix("event: ") for b in blocks]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    data = [json.loads(b.split("\n")[1].removeprefix("data: ")) for b in blocks]
    assert [d["sequence_number"] for d in data] == list(range(len(data)))
    assert "".join(d["delta"] for d in data if d["type"] == "response.output_text.delta") == "Five, I think."
    await endpoint.close()


async def test_what_is_not_served_is_refused_clearly():
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, ["ok"])
    endpoint, session, client = await served(engine, renderer, CFG)

    async def refused(code, message, **kw):
        with pytest.raises(openai.BadRequestError) as err:
            await client.responses.create(**{"model": MODEL, "input": "hi", **kw})
        assert err.value.code == code and message in str(err.value), err.value
        assert not session.samples and not engine.prompts

    await refused("unsupported_value", "keeps no responses", previous_response_id="resp_123")
    await refused("unsupported_value", "only function tools", tools=[{"type": "web_search"}])
    await refused("invalid_value", "input must be a string or a non-empty array", input=[])
    await refused("invalid_value", "item type must be one of", input=[{"type": "image_generation_call"}])
    await refused("invalid_value", "not among the request's tools", tools=[ADD],
                  tool_choice={"type": "function", "name": "multiply"})
    ok = await client.responses.create(model=MODEL, input="hi")
    assert ok.output_text == "ok" and len(session.samples) == 1
    await client.close()
    await endpoint.close()
