"""The OpenAI Responses API (``POST /v1/responses``) on top of the chat-completions session.

A Responses request is translated into the chat-completions request it means, served by the same
:class:`~agentenv.agents.session.AgentSession` (so rows, masks, versions and the history checks are
those of chat completions), and the reply is written back as a ``response`` object or, for
``stream=true``, as its typed server-sent events. The translation:

* ``instructions`` -> a system message first; ``input`` a string -> one user message;
* input items: a ``message`` (roles ``system``/``developer``/``user``/``assistant``, text or
  ``input_text``/``output_text`` parts) -> that message; ``function_call`` items -> the
  ``tool_calls`` of the assistant message they follow (or of a new one); ``function_call_output``
  -> a ``tool`` message; ``reasoning`` items are dropped (the row keeps what the model wrote);
* ``tools`` (``{"type": "function", "name", "parameters"}``) -> chat tools; ``tool_choice``
  (``{"type": "function", "name"}`` included) -> the chat form; ``max_output_tokens`` -> ``max_tokens``.

The endpoint is stateless: ``previous_response_id`` and ``store=true`` conversations are refused;
an agent sends its whole input each turn, as with chat completions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from agentenv.agents.openai_format import ServedReply, text_pieces
from agentenv.agents.session import bad_request, content_text

#: Item types of ``input`` this endpoint reads.
INPUT_ITEMS = ("message", "function_call", "function_call_output", "reasoning")


#: Content part types of an input message.
TEXT_PARTS = ("input_text", "output_text", "text")


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a Responses request's ``instructions`` and ``input`` mean (module docstring).

    Raises:
        OpenAIError: A missing or malformed ``input``, an item of an unknown type, a
            ``function_call`` without ``call_id``/``name`` (400).
    """
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": content_text(body["instructions"], "instructions", TEXT_PARTS)})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input must be a string or a non-empty array of items", "input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, Mapping) else None
        if kind not in INPUT_ITEMS:
            raise bad_request(f"{where}: item type must be one of {', '.join(INPUT_ITEMS)}", where)
        if kind == "message":
            messages.append({"role": item.get("role"), "content": content_text(item.get("content"), where, TEXT_PARTS)})
        elif kind == "function_call":
            if not isinstance(item.get("call_id"), str) or not isinstance(item.get("name"), str):
                raise bad_request(f"{where}: a function_call needs call_id and name", where)
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item.get("arguments", "{}")}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"),
                             "content": output if isinstance(output, str) else json.dumps(output)})
    return messages


def chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat-completions request body a Responses request means.

    Raises:
        OpenAIError: ``previous_response_id`` (400 ``unsupported_value``: the endpoint keeps no
            responses), a malformed ``input`` or ``tools`` (400).
    """
    if body.get("previous_response_id") is not None:
        raise bad_request("previous_response_id is not served: this endpoint keeps no responses; send the whole "
                          "conversation as input", "previous_response_id", "unsupported_value")
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools must be an array", "tools")
    chat_tools = []
    for i, t in enumerate(tools or []):
        if not isinstance(t, Mapping) or t.get("type") != "function":
            raise bad_request(f"tools[{i}]: only function tools are served", f"tools[{i}]", "unsupported_value")
        fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
        chat_tools.append({"type": "function", "function": fn})
    choice = body.get("tool_choice")
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    request: dict[str, Any] = {"model": body.get("model"), "messages": chat_messages(body),
                               "stream": body.get("stream"), "tool_choice": choice}
    if chat_tools:
        request["tools"] = chat_tools
    for ours, theirs in (("max_tokens", "max_output_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if body.get(theirs) is not None:
            request[ours] = body[theirs]
    return request


def output_items(reply: ServedReply) -> list[dict[str, Any]]:
    """The ``output`` items of a reply: reasoning, the message, then one ``function_call`` per call."""
    items: list[dict[str, Any]] = []
    message = reply.message
    if message.get("reasoning_content"):
        items.append({"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}",
                      "summary": [{"type": "summary_text", "text": message["reasoning_content"]}]})
    if message.get("content") or not message.get("tool_calls"):
        items.append({"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": message.get("content") or "", "annotations": []}]})
    for call in message.get("tool_calls") or []:
        items.append({"type": "function_call", "id": f"fc_{call['id']}", "call_id": call["id"], "status": "completed",
                      "name": call["function"]["name"], "arguments": call["function"]["arguments"]})
    return items


def response_object(reply: ServedReply, body: Mapping[str, Any], *, status: str | None = None,
                    output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``response`` object of a reply (``status`` and ``output`` overridable for the stream's first events)."""
    cut = reply.finish_reason == "length"
    done = status is None
    return {
        "id": reply.id.replace("chatcmpl-", "resp_"), "object": "response", "created_at": reply.created,
        "status": status or ("incomplete" if cut else "completed"), "model": reply.model,
        "output": output_items(reply) if output is None else output,
        "incomplete_details": {"reason": "max_output_tokens"} if cut and done else None, "error": None,
        "instructions": body.get("instructions"), "metadata": {}, "parallel_tool_calls": True,
        "temperature": body.get("temperature"), "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto", "tools": list(body.get("tools") or []),
        "text": {"format": {"type": "text"}},
        "usage": {"input_tokens": reply.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": reply.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": reply.prompt_tokens + reply.completion_tokens} if done else None,
    }


def response_events(reply: ServedReply, body: Mapping[str, Any]) -> list[str]:
    """The stream of a Responses reply: ``event: TYPE`` / ``data: {...}`` pairs, in the API's order.

    ``response.created`` and ``response.in_progress``; per output item ``output_item.added``, its
    deltas (``output_text.delta`` in word-sized pieces, ``function_call_arguments.delta``) and their
    ``done`` events, ``output_item.done``; then ``response.completed`` (``response.incomplete`` for a
    reply cut by a token budget) with the full response. The deltas join to the non-streamed output.
    """
    events: list[dict[str, Any]] = []
    events.append({"type": "response.created", "response": response_object(reply, body, status="in_progress",
                                                                             output=[])})
    events.append({"type": "response.in_progress", "response": response_object(reply, body, status="in_progress",
                                                                                 output=[])})
    for k, item in enumerate(output_items(reply)):
        if item["type"] == "message":
            text = item["content"][0]["text"]
            events.append({"type": "response.output_item.added", "output_index": k,
                           "item": {**item, "status": "in_progress", "content": []}})
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": k,
                           "content_index": 0, "part": part})
            events += [{"type": "response.output_text.delta", "item_id": item["id"], "output_index": k,
                        "content_index": 0, "delta": p, "logprobs": []} for p in text_pieces(text)]
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": k,
                           "content_index": 0, "text": text, "logprobs": []})
            events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": k,
                           "content_index": 0, "part": {**part, "text": text}})
        elif item["type"] == "function_call":
            events.append({"type": "response.output_item.added", "output_index": k,
                           "item": {**item, "status": "in_progress", "arguments": ""}})
            events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                           "output_index": k, "delta": item["arguments"]})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": k, "arguments": item["arguments"]})
        else:
            events.append({"type": "response.output_item.added", "output_index": k, "item": item})
        events.append({"type": "response.output_item.done", "output_index": k, "item": item})
    final = response_object(reply, body)
    events.append({"type": f"response.{final['status']}", "response": final})
    return [f"event: {e['type']}\ndata: {json.dumps({**e, 'sequence_number': n})}\n\n" for n, e in enumerate(events)]
