"""Tool-call parsers of the model families beyond Hermes (registry: :data:`agentenv.rollout.tool_calls.TOOL_PARSERS`).

Each parser reads one reply as decoded with its special tokens kept (``Conversation.add_reply``;
``[TOOL_CALLS]``, ``<|python_tag|>``, ``<|channel|>`` and DeepSeek's markers are special tokens),
separates the reasoning from the answer where the family has it, and never raises on model text:
a botched call is a :class:`~agentenv.rollout.tool_calls.ToolCallError` for the model to read.

===============  ============================================================================
``qwen3``        ``<think>...</think>`` then Hermes ``<tool_call>{json}</tool_call>`` blocks
``llama3_json``  the reply *is* ``{"name": ..., "parameters": {...}}`` (several joined by ``;``),
                 optionally after ``<|python_tag|>``; ``<|python_tag|>name.call(k="v")`` is a
                 built-in tool and ``<|python_tag|>`` + code a ``python`` call
``mistral``      ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (v3) or
                 ``[TOOL_CALLS]name[ARGS]{json}`` (v11+); ``[THINK]...[/THINK]`` reasoning
``harmony``      gpt-oss messages ``<|channel|>analysis|commentary|final ... <|message|>...``;
                 ``to=functions.NAME`` is a call with JSON arguments, the analysis channel reasoning
``deepseek``     ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` and a
                 fenced JSON block (V3; V3.1's ``NAME<｜tool▁sep｜>{json}`` too); R1's ``<think>``
===============  ============================================================================
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import replace

from agentenv.rollout.tool_calls import (
    HermesToolCallParser,
    ParsedReply,
    ToolCall,
    ToolCallError,
    _call_from_obj,
    _decode_call,
    _scan_json_object,
    _with_arguments,
)

Item = ToolCall | ToolCallError


def _reply(items: list[Item], content: str, reasoning: str = "") -> ParsedReply:
    calls = tuple(i for i in items if isinstance(i, ToolCall))
    errors = tuple(i for i in items if isinstance(i, ToolCallError))
    return ParsedReply(calls, errors, content.strip(), tuple(items), reasoning.strip())


def _split_reasoning(text: str, open_tag: str, close_tag: str) -> tuple[str, str]:
    """``(reasoning, rest)``: the text up to ``close_tag`` (without ``open_tag``) and what follows.

    The open tag may be missing (a prompt that opened the block already); a block that is opened
    but never closed is all reasoning (the model was cut while thinking: nothing in it is a call).
    """
    close = text.find(close_tag)
    if close >= 0:
        head = text[:close]
        opened = head.find(open_tag)
        return head[opened + len(open_tag) :] if opened >= 0 else head, text[close + len(close_tag) :]
    stripped = text.lstrip()
    if stripped.startswith(open_tag):
        return stripped[len(open_tag) :], ""
    return "", text


def _strip_suffix(text: str, *suffixes: str) -> str:
    text = text.rstrip()
    for s in suffixes:
        if text.endswith(s):
            text = text[: -len(s)].rstrip()
    return text


def _json_args(name: str, body: str) -> Item:
    """A call to ``name`` whose arguments are the JSON object ``body`` (or an error)."""
    body = body.strip()
    try:
        args = json.loads(body, strict=False) if body else {}
    except json.JSONDecodeError as exc:
        return ToolCallError(f"arguments of {name!r} are not valid JSON: {exc.msg} (column {exc.colno})", body)
    return _with_arguments(name, args, body)


class Qwen3ToolCallParser:
    """Qwen3: an optional ``<think>`` block (the reasoning), then Hermes ``<tool_call>`` blocks.

    Calls written inside the reasoning are thoughts, not calls.
    """

    def __init__(self) -> None:
        self._hermes = HermesToolCallParser()

    def call_opening(self, name: str | None) -> str:
        """The Hermes opening (a forced call skips the reasoning block)."""
        return self._hermes.call_opening(name)

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors, answer and reasoning of ``text``."""
        reasoning, rest = _split_reasoning(text, "<think>", "</think>")
        return replace(self._hermes.parse(rest), reasoning=reasoning.strip())


_PYTHON_TAG = "<|python_tag|>"
_BUILTIN = re.compile(r"([A-Za-z_]\w*)\.call\((.*)\)", re.S)


class Llama3JsonToolCallParser:
    """Llama 3.1 / 3.2 / 3.3 JSON tool calls (the format of their chat template's ``tool_calls``).

    A reply that starts with ``{`` (after an optional ``<|python_tag|>``) and whose object has a
    ``"name"`` is a call; prose first, or JSON without ``"name"``, is an answer. Several calls may be
    joined by ``;``. A reply that starts like a call (``{"name"`` or ``<|python_tag|>``) but does
    not parse is an error.
    """

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors and answer of ``text``."""
        body = _strip_suffix(text, "<|eom_id|>", "<|eot_id|>").strip()
        tagged = body.startswith(_PYTHON_TAG)
        if tagged:
            body = body[len(_PYTHON_TAG) :].strip()
        if not body.startswith("{"):
            if tagged and body:
                return _reply([self._builtin(body)], "")
            return _reply([], body if not tagged else "")
        items: list[Item] = []
        pos = 0
        while pos < len(body):
            end = _scan_json_object(body, pos)
            if end is None:
                items.append(ToolCallError("tool call is not a complete JSON object", body[pos:]))
                break
            raw = body[pos:end]
            item = _decode_call(raw)
            if not items and isinstance(item, ToolCallError) and not tagged and '"name"' not in raw:
                return _reply([], body)  # JSON that is not a call: an answer
            items.append(item)
            pos = end
            while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
                pos += 1
            if pos < len(body) and body[pos] != "{":
                items.append(ToolCallError("unexpected text after the JSON tool call", body[pos:]))
                break
        return _reply(items, "")

    @staticmethod
    def _builtin(body: str) -> Item:
        """``name.call(k="v", ...)`` (a built-in tool), else code for the code interpreter (``python``)."""
        m = _BUILTIN.fullmatch(body)
        if m is None:
            return ToolCall("python", {"code": body})
        try:
            call = ast.parse(f"f({m.group(2)})", mode="eval").body
            assert isinstance(call, ast.Call) and not call.args
            args = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords if kw.arg}
        except (SyntaxError, ValueError, AssertionError):
            return ToolCallError(f"built-in tool call {m.group(1)}.call(...) has arguments that are not k=value", body)
        return ToolCall(m.group(1), args)


_TOOL_CALLS = "[TOOL_CALLS]"


class MistralToolCallParser:
    """Mistral ``[TOOL_CALLS]`` calls: a JSON list (tokenizer v3..v7) or ``name[ARGS]{json}`` (v11+).

    The text before the first ``[TOOL_CALLS]`` is the answer; ``[THINK]...[/THINK]`` (Magistral) is
    the reasoning.
    """

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors, answer and reasoning of ``text``."""
        reasoning, text = _split_reasoning(_strip_suffix(text, "</s>"), "[THINK]", "[/THINK]")
        content, *chunks = text.split(_TOOL_CALLS)
        items: list[Item] = []
        for chunk in chunks:
            self._chunk(chunk.strip(), items)
        return _reply(items, content, reasoning)

    @staticmethod
    def _chunk(c: str, items: list[Item]) -> None:
        if c.startswith(("[", "{")):
            end = _scan_json_object(c, 0)
            if end is None:
                items.append(ToolCallError("[TOOL_CALLS] is followed by JSON that is not closed", c))
                return
            raw = c[:end]
            try:
                value = json.loads(raw, strict=False)
            except json.JSONDecodeError as exc:
                items.append(ToolCallError(f"tool calls are not valid JSON: {exc.msg} (column {exc.colno})", raw))
                return
            for obj in value if isinstance(value, list) else [value]:
                items.append(_call_from_obj(obj, raw))
            if not value and isinstance(value, list):
                items.append(ToolCallError("[TOOL_CALLS] lists no call", raw))
            if c[end:].strip():
                items.append(ToolCallError("unexpected text after the [TOOL_CALLS] JSON", c[end:].strip()))
            return
        name, sep, args = c.partition("[ARGS]")
        name = name.split("[CALL_ID]")[0].strip()
        if not sep or not name:
            items.append(ToolCallError("[TOOL_CALLS] must be followed by a JSON list or name[ARGS]{...}", c))
            return
        items.append(_json_args(name, args))


_HARMONY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_CHANNEL = re.compile(r"<\|channel\|>\s*([\w.-]+)")
_RECIPIENT = re.compile(r"\bto=([\w.\-]+)")


class HarmonyToolCallParser:
    """gpt-oss (harmony) messages: reasoning, answer and calls by channel and recipient.

    The analysis channel is the reasoning, final (and plain commentary) the answer, and a message
    addressed ``to=functions.NAME`` a call with a JSON body (``to=python``: code).

    The reply is read as sampled after ``<|start|>assistant``: messages are split at ``<|start|>``
    and end at ``<|end|>``, ``<|call|>`` or ``<|return|>`` (the stop token itself may be absent).
    """

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors, answer and reasoning of ``text``."""
        items: list[Item] = []
        content: list[str] = []
        reasoning: list[str] = []
        for chunk in text.split("<|start|>"):
            if not chunk.strip():
                continue
            header, sep, body = chunk.partition("<|message|>")
            recipient = _RECIPIENT.search(header)
            if not sep:
                if recipient:
                    items.append(ToolCallError(f"call to {recipient.group(1)!r} has no <|message|> body", chunk))
                else:
                    content.append(chunk)
                continue
            cut = min((i for i in (body.find(e) for e in _HARMONY_ENDS) if i >= 0), default=len(body))
            body = body[:cut]
            channel = _CHANNEL.search(header)
            if recipient:
                to = recipient.group(1)  # functions.NAME, or a built-in tool (python, browser.*)
                if to == "python":
                    items.append(ToolCall("python", {"code": body}))
                else:
                    items.append(_json_args(to.removeprefix("functions."), body))
            elif channel and channel.group(1) == "analysis":
                reasoning.append(body)
            else:
                content.append(body)
        return _reply(items, "\n".join(c.strip() for c in content if c.strip()), "\n".join(reasoning))


_DS_BEGIN, _DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
_DS_CALL, _DS_CALL_END, _DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_FENCE = re.compile(r"\A\s*```(?:json)?\s*\n?(.*?)\n?\s*```\s*\Z", re.S)


class DeepSeekToolCallParser:
    """DeepSeek V3 / R1 / V3.1 tool calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``.

    V3/R1: ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`` newline, a fenced JSON block,
    ``<｜tool▁call▁end｜>``; V3.1: ``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>``.
    A missing ``<｜tool▁calls▁end｜>`` is accepted (DeepSeek-V3's own template omits it after a
    single call); a call without its end marker is accepted only when its JSON is complete.
    ``<think>...</think>`` (R1) is the reasoning.
    """

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors, answer and reasoning of ``text``."""
        reasoning, text = _split_reasoning(_strip_suffix(text, "<｜end▁of▁sentence｜>"), "<think>", "</think>")
        starts = [i for i in (text.find(_DS_BEGIN), text.find(_DS_CALL)) if i >= 0]
        if not starts:
            return _reply([], text, reasoning)
        at = min(starts)
        content, rest = text[:at], text[at:].replace(_DS_BEGIN, "", 1)
        items: list[Item] = []
        pos = 0
        while (start := rest.find(_DS_CALL, pos)) >= 0:
            end = rest.find(_DS_CALL_END, start)
            block = rest[start + len(_DS_CALL) : end if end >= 0 else len(rest)]
            if end < 0:
                block = block.replace(_DS_END, "")
            items.append(self._call(block, closed=end >= 0))
            pos = end + len(_DS_CALL_END) if end >= 0 else len(rest)
        tail = rest[pos:].replace(_DS_END, "").strip()
        if tail:
            content = f"{content}\n{tail}"
        return _reply(items, content, reasoning)

    @staticmethod
    def _call(block: str, *, closed: bool) -> Item:
        kind, sep, after = block.partition(_DS_SEP)
        if not sep:
            return ToolCallError("tool call has no <｜tool▁sep｜> between its type and name", block)
        if after.lstrip().startswith("{"):  # V3.1: NAME<｜tool▁sep｜>{json}
            name, args = kind.strip(), after
        else:  # V3 / R1: function<｜tool▁sep｜>NAME \n ```json ... ```
            name, _, args = after.partition("\n")
            name = name.strip()
            fenced = _FENCE.match(args)
            if fenced:
                args = fenced.group(1)
            elif not closed:
                return ToolCallError(f"call to {name!r} is not closed with <｜tool▁call▁end｜>", block)
            else:
                return ToolCallError(f"arguments of {name!r} are not a ```json fenced block", block)
        if not name:
            return ToolCallError("tool call has no name", block)
        if not closed and _scan_json_object(args.strip(), 0) is None:
            return ToolCallError(f"call to {name!r} is not closed with <｜tool▁call▁end｜>", block)
        return _json_args(name, args)
