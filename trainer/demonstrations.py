r"""An environment's scripted demonstrations rendered as the warm-up trains on them.

An env writes its demonstrations as chat messages (:class:`agentenv.core.Demonstration`: the task,
the assistant's replies, with tool calls as structured calls, and the observations); it knows no
tokenizer. This module lays each one out in token ids exactly as a rollout of the same replies
would be, with the policy's chat template: the prompt as the rollout's first prompt, each reply as
the model's ids followed by its end-of-turn token, each observation rendered against the real
history. Tool calls are written in the call syntax of the template's tool-call family
(:data:`DEMONSTRATION_FAMILIES`), and each reply is read back with that family's parser before it
is trained on, so the model learns exactly the layout it will later generate into.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.core import Demonstration
from agentenv.errors import TemplateError
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.episode import ConversationRenderer
from agentenv.rollout.tool_calls import get_tool_parser

#: Chat template families (:data:`agentenv.rollout.tool_calls.TOOL_PARSERS`) a demonstration's tool calls are
#: written for; ``harmony`` (gpt-oss) is refused: its replies are channel messages, not call text.
DEMONSTRATION_FAMILIES = ("hermes", "qwen25", "qwen3", "llama3_json", "deepseek", "mistral")

#: A tool call as the demonstration gives it: ``(name, arguments)``.
Call = tuple[str, Mapping[str, Any]]


def tool_call_text(calls: Sequence[Call], family: str = "hermes") -> str:
    r"""The assistant text of ``calls`` in the call syntax of ``family``.

    ``hermes``/``qwen25``/``qwen3``: one ``<tool_call>\n{json}\n</tool_call>`` block per call, joined
    by a newline; ``llama3_json``: the JSON object with ``parameters`` (one call only); ``deepseek``:
    the V3 call markers around a fenced JSON block per call; ``mistral``: ``[TOOL_CALLS]`` and a JSON
    list.

    Raises:
        TemplateError: ``family`` is not one of :data:`DEMONSTRATION_FAMILIES`, or ``llama3_json``
            with more than one call.
    """
    if family in ("hermes", "qwen25", "qwen3"):
        return "\n".join("<tool_call>\n" + json.dumps({"name": name, "arguments": dict(args)}) + "\n</tool_call>"
                         for name, args in calls)
    if family == "llama3_json":
        if len(calls) != 1:
            raise TemplateError(f"the llama3_json call syntax writes one tool call per reply, not {len(calls)}")
        (name, args), = calls
        return json.dumps({"name": name, "parameters": dict(args)})
    if family == "deepseek":
        return ("<｜tool▁calls▁begin｜>" + "".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(dict(args))}\n```<｜tool▁call▁end｜>"
            for name, args in calls) + "<｜tool▁calls▁end｜>")
    if family == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": name, "arguments": dict(args)} for name, args in calls])
    raise TemplateError(f"the warm-up's scripted demonstrations cannot write a tool call for the chat template "
                        f"family {family!r} (they write {', '.join(DEMONSTRATION_FAMILIES)}); set warmup.steps=0")


def template_family(renderer: ChatRenderer) -> str:
    """The tool-call family of the renderer's chat template (``renderer.tool_parser_name``), else ``"hermes"``.

    ``"hermes"`` is also what an env parses with when the template implies no family.
    """
    return renderer.tool_parser_name or "hermes"


def _calls(message: Mapping[str, Any]) -> list[Call]:
    """The ``(name, arguments)`` of an assistant message's ``tool_calls`` (:class:`agentenv.core.Demonstration`)."""
    return [(call["function"]["name"], call["function"].get("arguments") or {})
            for call in message.get("tool_calls") or ()]


def render_demonstration(
    renderer: ChatRenderer, encode: Callable[[str], list[int]], demo: Demonstration
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one demonstration, laid out exactly as a rollout of its replies would be.

    With a renderer that keeps the conversation (:class:`agentenv.rollout.episode.ConversationRenderer`),
    the transcript is built as the rollout builds an episode: the replies as the model's ids, each
    observation rendered against the real history (so templates that rewrite earlier turns, Qwen3's,
    work too), each reply opening with what the template writes before an assistant answer (Qwen3's
    empty think block in thinking mode), and each reply read back with the family's tool-call
    parser: a reply with calls must parse as exactly those calls, one without as no call. With a
    plain renderer, observations are rendered as deltas (``observation_tokens``), as the rollout does.

    Args:
        renderer: The policy's chat renderer.
        encode: Tokenizer encoding of assistant text without special tokens.
        demo: The env's demonstration (:meth:`agentenv.core.Env.scripted_demonstrations`).

    Returns:
        ``(ids, mask)``, both ``(L,)`` tokens; mask is 1 on assistant tokens (their end of turn included).

    Raises:
        TemplateError: The template's family has no call syntax here (:func:`tool_call_text`), the
            template failed to render, or a reply does not read back as written (the message names
            the family).
    """
    eot = [renderer.stop_token_ids[0]]
    family = template_family(renderer)
    task, *turns = demo.messages
    tools = [dict(t) for t in demo.tools]
    conv = None
    opening = ""
    if isinstance(renderer, ConversationRenderer):
        conv = renderer.conversation(task["content"], system=demo.system, tools=tools)
        ids = list(conv.prompt_ids)
        opening = _reply_opening(renderer, demo.system, tools)
    else:
        ids = renderer.initial_prompt(task["content"], system=demo.system, tools=tools)
    mask = [0] * len(ids)
    for message in turns:
        if message["role"] == "assistant":
            calls = _calls(message)
            text = tool_call_text(calls, family) if calls else message["content"]
            part = encode(opening + text) + eot
            if conv is not None:
                _check_reply(conv.add_reply(part), family, calls)
            flag = 1
        else:
            part = (list(conv.observe(message["role"], message["content"], policy="append").ids) if conv is not None
                    else renderer.observation_tokens(message["role"], message["content"]))
            flag = 0
        ids += part
        mask += [flag] * len(part)
    return ids, mask


_PROBE = "agentenv-demonstration-answer"


def _reply_opening(renderer: ConversationRenderer, system: str | None, tools: Sequence[dict]) -> str:
    r"""What the template writes at the start of an assistant answer after its generation prompt.

    ``"<think>\n\n</think>\n\n"`` for Qwen3 in thinking mode (the model opens every reply with its
    reasoning; an answer without reasoning has an empty block), ``""`` for templates whose
    generation prompt already holds it or that have none.
    """
    conv = renderer.conversation(_PROBE, system=system, tools=list(tools))
    asked = renderer.decode(conv.prompt_ids, keep_special=True)
    answered = renderer.conversation_from(
        [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": _PROBE},
         {"role": "assistant", "content": _PROBE}], tools=list(tools))
    text = renderer.decode(answered.prompt_ids, keep_special=True)
    if not text.startswith(asked):
        return ""
    rest = text[len(asked):]
    at = rest.find(_PROBE)
    return rest[:at] if at > 0 else ""


def _check_reply(text: str, family: str, calls: Sequence[Call]) -> None:
    """Raise unless the family's parser reads ``text`` as exactly ``calls`` (empty: as no call)."""
    parsed = get_tool_parser(family).parse(text)
    if not calls:
        ok = not parsed.attempted
    else:
        ok = not parsed.errors and [(c.name, dict(c.arguments)) for c in parsed.calls] == [
            (name, dict(args)) for name, args in calls]
    if not ok:
        what = "no tool call" if not calls else ", ".join(f"the {name} call" for name, _ in calls)
        raise TemplateError(f"the warm-up's scripted reply does not read back as {what} with the {family!r} "
                            f"tool-call parser of this chat template: {text[:200]!r}")
