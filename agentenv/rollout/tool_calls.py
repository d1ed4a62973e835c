"""Tool calls parsed from a model's reply text.

A parser turns one assistant reply into the calls it makes and the calls it botched. A botched call
is not an exception: it becomes a :class:`ToolCallError` that the environment shows the model as an
error observation, so a malformed call costs the episode a turn, never the trainer a crash.

:class:`HermesToolCallParser` reads the Hermes / Qwen2.5 format::

    <tool_call>
    {"name": "python", "arguments": {"code": "print(1)"}}
    </tool_call>

It is lenient where models are sloppy in practice (docs/architecture.md, "Known pitfalls"):

* raw line breaks and tabs inside JSON strings are accepted (``json.loads(strict=False)``);
* ``arguments`` may be a JSON object or a string holding one (``"parameters"`` is read as an alias);
* ``</tool_call>`` inside a JSON string (e.g. in code) does not end the call: the JSON object is
  scanned with a string-aware brace matcher;
* a missing ``</tool_call>`` is accepted when a complete JSON object is followed only by whitespace
  up to the end of the reply (the model stopped at its end-of-turn token); otherwise it is an error;
* malformed JSON, a missing ``name`` or non-object ``arguments`` give a :class:`ToolCallError`;
* JSON in ordinary prose without the ``<tool_call>`` tag is not a call;
* text after the last ``</tool_call>`` is ignored by default (as vLLM's hermes parser drops it);
  ``trailing_text="error"`` makes such a reply one malformed call instead (none of its calls run),
  for training: a stray token after the closing tag then costs the episode its tool result, so it
  is not reinforced along with the call (BENCHMARKS.md, "Learning runs").

Other families' formats live in :mod:`agentenv.rollout.tool_formats` (Qwen3 with ``<think>``, Llama 3.x
JSON, Mistral ``[TOOL_CALLS]``, gpt-oss harmony, DeepSeek). :func:`get_tool_parser` builds one by
name (:data:`TOOL_PARSERS`) and :func:`parser_for_template` names the one a chat template implies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentenv.errors import ConfigError

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


@dataclass(frozen=True)
class ToolCall:
    """One well-formed tool call.

    Attributes:
        name: Tool name as the model wrote it (not checked against the available tools here).
        arguments: The call's arguments, decoded to a dict.
    """

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    """A call the model attempted but that could not be parsed.

    Attributes:
        message: Why it failed, phrased for the model (it is shown as an observation).
        raw: The offending text (the tag's content), for logs and the observation.
    """

    message: str
    raw: str


@dataclass(frozen=True)
class ParsedReply:
    """What a parser found in one reply.

    Attributes:
        calls: Well-formed calls, in the order they appear.
        errors: Attempted calls that failed to parse, in order.
        content: The reply with every tool-call block (and reasoning block) removed: the answer.
        items: Calls and errors together, in the order they appear in the reply.
        reasoning: The reply's reasoning (Qwen3/DeepSeek-R1 ``<think>``, harmony's analysis
            channel, Mistral's ``[THINK]``), separated from the answer; "" when there is none.
    """

    calls: tuple[ToolCall, ...] = ()
    errors: tuple[ToolCallError, ...] = ()
    content: str = ""
    items: tuple[ToolCall | ToolCallError, ...] = ()
    reasoning: str = ""

    @property
    def attempted(self) -> bool:
        """True when the reply tried to call a tool (well-formed or not)."""
        return bool(self.calls or self.errors)


@runtime_checkable
class ToolCallParser(Protocol):
    """Turns a reply into tool calls; never raises on model text."""

    def parse(self, text: str) -> ParsedReply:
        """Return the calls and errors found in ``text``."""
        ...


@runtime_checkable
class ForcedCallParser(ToolCallParser, Protocol):
    """A parser whose format lets a reply be forced to open a tool call (``tool_choice``).

    The endpoint serves ``tool_choice="required"`` or a named function by putting the call's opening
    text in the row as environment tokens (the model conditions on them; the learner does not train
    on them) and sampling the rest of the call.
    """

    def call_opening(self, name: str | None) -> str:
        """The text a reply starts with to call the tool ``name`` (None: any tool; the model writes the name)."""
        ...


def _scan_json_object(text: str, start: int) -> int | None:
    """Return the index one past the ``}`` closing the object that opens at ``text[start]``.

    Braces inside JSON strings (with backslash escapes) are ignored. Returns None when the object
    is not closed before the end of ``text``.
    """
    depth = 0
    in_string = False
    escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _decode_call(raw: str) -> ToolCall | ToolCallError:
    """Decode one tag's JSON body into a call or an error."""
    try:
        obj = json.loads(raw, strict=False)
    except json.JSONDecodeError as exc:
        return ToolCallError(
            f"tool call is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})", raw
        )
    return _call_from_obj(obj, raw)


def _call_from_obj(obj: Any, raw: str) -> ToolCall | ToolCallError:
    """A call from a decoded JSON value ``{"name": ..., "arguments" | "parameters": ...}``, or an error."""
    if not isinstance(obj, dict):
        return ToolCallError("tool call must be a JSON object with 'name' and 'arguments'", raw)
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ToolCallError("tool call has no 'name' string", raw)
    args: Any = obj.get("arguments", obj.get("parameters", {}))
    return _with_arguments(name.strip(), args, raw)


def _with_arguments(name: str, args: Any, raw: str) -> ToolCall | ToolCallError:
    """``ToolCall(name, args)`` where ``args`` is a dict, a JSON string of one, or None; else an error."""
    if isinstance(args, str):
        try:
            args = json.loads(args, strict=False) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCallError(f"'arguments' is a string that is not valid JSON: {exc.msg}", raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCallError("'arguments' must be a JSON object", raw)
    return ToolCall(name=name, arguments=args)


class HermesToolCallParser:
    """Parser for ``<tool_call>{json}</tool_call>`` blocks (Hermes, Qwen2.5, Qwen3).

    See the module docstring for what is accepted leniently and what becomes an error.

    Args:
        trailing_text: ``"ignore"`` (default): prose after the last call block is part of
            :attr:`ParsedReply.content`; ``"error"``: a reply with calls and non-whitespace text after
            the last ``</tool_call>`` parses as one :class:`ToolCallError` (its calls are dropped).

    Raises:
        ConfigError: ``trailing_text`` is neither ``"ignore"`` nor ``"error"``.
    """

    TRAILING_TEXT = ("ignore", "error")

    def __init__(self, trailing_text: str = "ignore") -> None:
        if trailing_text not in self.TRAILING_TEXT:
            raise ConfigError(f"trailing_text must be one of {self.TRAILING_TEXT}, got {trailing_text!r}")
        self.trailing_text = trailing_text

    @staticmethod
    def call_opening(name: str | None) -> str:
        """``<tool_call>`` and the JSON up to the name (``name`` None) or up to the arguments.

        See :class:`ForcedCallParser`.
        """
        head = OPEN_TAG + '\n{"name": "'
        return head if name is None else head + name + '", "arguments": '

    def parse(self, text: str) -> ParsedReply:
        """Return the calls, errors and remaining prose of ``text``."""
        items: list[ToolCall | ToolCallError] = []
        prose: list[str] = []
        pos = 0
        while True:
            open_at = text.find(OPEN_TAG, pos)
            if open_at < 0:
                prose.append(text[pos:])
                break
            prose.append(text[pos:open_at])
            body_start = open_at + len(OPEN_TAG)
            pos = self._parse_one(text, body_start, items)
        trailing = prose[-1].strip()
        if self.trailing_text == "error" and items and trailing:
            message = f"text after </tool_call> ({trailing[:40]!r}); a reply that calls a tool ends with </tool_call>"
            items = [ToolCallError(message, trailing)]
        calls = tuple(i for i in items if isinstance(i, ToolCall))
        errors = tuple(i for i in items if isinstance(i, ToolCallError))
        return ParsedReply(calls, errors, "".join(prose).strip(), tuple(items))

    @staticmethod
    def _parse_one(text: str, body_start: int, items: list[ToolCall | ToolCallError]) -> int:
        """Parse the block whose body starts at ``body_start``; return where scanning resumes."""
        close_at = text.find(CLOSE_TAG, body_start)
        i = body_start
        while i < len(text) and text[i].isspace():
            i += 1
        end = _scan_json_object(text, i) if i < len(text) and text[i] == "{" else None
        if end is not None:
            rest = end
            while rest < len(text) and text[rest].isspace():
                rest += 1
            if text.startswith(CLOSE_TAG, rest):
                calls_or_err = _decode_call(text[i:end])
                items.append(calls_or_err)
                return rest + len(CLOSE_TAG)
            if rest == len(text):  # lenient: complete object, then only the end of the reply
                calls_or_err = _decode_call(text[i:end])
                items.append(calls_or_err)
                return rest
        # Not a clean object followed by the closing tag: report the block as malformed.
        if close_at < 0:
            raw = text[body_start:].strip()
            items.append(
                ToolCallError(
                    "tool call is not closed with </tool_call> and is not a complete JSON object", raw
                )
            )
            return len(text)
        raw = text[body_start:close_at].strip()
        decoded = _decode_call(raw)
        if isinstance(decoded, ToolCall):  # e.g. text after the object inside the tags
            items.append(ToolCallError("unexpected text after the JSON object inside <tool_call>", raw))
        else:
            items.append(decoded)
        return close_at + len(CLOSE_TAG)


#: Registered parsers: name -> ``"module:Class"`` (imported on first use).
TOOL_PARSERS: dict[str, str] = {
    "hermes": "agentenv.rollout.tool_calls:HermesToolCallParser",
    "qwen25": "agentenv.rollout.tool_calls:HermesToolCallParser",
    "qwen3": "agentenv.rollout.tool_formats:Qwen3ToolCallParser",
    "llama3_json": "agentenv.rollout.tool_formats:Llama3JsonToolCallParser",
    "mistral": "agentenv.rollout.tool_formats:MistralToolCallParser",
    "harmony": "agentenv.rollout.tool_formats:HarmonyToolCallParser",
    "deepseek": "agentenv.rollout.tool_formats:DeepSeekToolCallParser",
}

# (marker in the template, parser) in the order they are tried: the first marker found wins.
_TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>",), "harmony"),
    (("[TOOL_CALLS]",), "mistral"),
    (("tool\u2581calls\u2581begin",), "deepseek"),
    (("<|python_tag|>",), "llama3_json"),
    (("<|eot_id|>", '"parameters": '), "llama3_json"),
    (("<tool_call>", "<think>"), "qwen3"),
    (("<tool_call>",), "hermes"),
)


def get_tool_parser(name: str) -> ToolCallParser:
    """A new parser of the registered family ``name`` (see :data:`TOOL_PARSERS`).

    Raises:
        ConfigError: ``name`` is not registered (the message lists the names that are).
    """
    import importlib

    target = TOOL_PARSERS.get(name)
    if target is None:
        raise ConfigError(f"unknown tool-call parser {name!r}; registered: {', '.join(sorted(TOOL_PARSERS))}")
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()


def parser_for_template(chat_template: str) -> str:
    """The registered parser name a chat template implies, from the call syntax it renders.

    Args:
        chat_template: Jinja source of the model's chat template.

    Returns:
        A key of :data:`TOOL_PARSERS`.

    Raises:
        ConfigError: The template shows no known tool-call syntax (choose a parser by name).
    """
    for markers, name in _TEMPLATE_MARKERS:
        if all(m in chat_template for m in markers):
            return name
    raise ConfigError("the chat template shows no known tool-call syntax; choose a parser by name "
                      f"({', '.join(sorted(TOOL_PARSERS))})")
