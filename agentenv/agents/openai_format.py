"""A served reply in the OpenAI chat-completions wire format: the response body, or its event stream.

The endpoint generates a reply whole (the engine's request ends at a stop token or a budget), then
writes it either as one ``chat.completion`` body or, for ``stream=true``, as server-sent events of
``chat.completion.chunk`` objects: the role, the reasoning and content in word-sized deltas, each
tool call as a delta with its id and name and then one with its arguments, a last chunk with the
finish reason (and the log-probabilities when asked), a usage chunk when
``stream_options.include_usage`` is set, and ``data: [DONE]``. With ``n > 1`` each choice streams in
turn under its own ``index``. Concatenating a choice's deltas gives its non-streamed message exactly;
the time to the first chunk is the time of the whole reply.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_PIECE = re.compile(r"\s*\S+|\s+")


@dataclass(frozen=True)
class Choice:
    """One choice of a reply: its assistant message, finish reason and log-probabilities (or None)."""

    message: dict[str, Any]
    finish_reason: str
    logprobs: dict[str, Any] | None = None


@dataclass(frozen=True)
class ServedReply:
    """One reply of the policy, as the endpoint writes it.

    Attributes:
        id: ``chatcmpl-...``.
        created: Unix time (seconds).
        model: The model name the agent asked for.
        message: The assistant message: ``role``, ``content``, and ``tool_calls`` or
            ``reasoning_content`` where the reply has them.
        finish_reason: ``"stop"``, ``"length"`` (a token budget cut it) or ``"tool_calls"``.
        prompt_tokens: Tokens the engine conditioned on (tokens).
        completion_tokens: Tokens sampled, over all choices (tokens).
        version: Policy version of the reply's last sampled token.
        logprobs: ``{"content": [{token, logprob, bytes, top_logprobs}, ...]}`` over the sampled
            tokens, or None when the request did not ask for them.
        more_choices: Choices 1..n-1 of a request with ``n > 1`` (choice 0 is ``message``).
        stream: The request asked for server-sent events (:meth:`events`), not a body.
        include_usage: The stream ends with a usage chunk (``stream_options.include_usage``).
    """

    id: str
    created: int
    model: str
    message: dict[str, Any]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    version: int
    logprobs: dict[str, Any] | None = None
    more_choices: tuple[Choice, ...] = ()
    stream: bool = False
    include_usage: bool = False

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "system_fingerprint": f"agentenv-v{self.version}"}

    def usage(self) -> dict[str, int]:
        """``{prompt_tokens, completion_tokens, total_tokens}``."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def body(self) -> dict[str, Any]:
        """The ``chat.completion`` response body."""
        first = Choice(self.message, self.finish_reason, self.logprobs)
        choices = [{"index": k, "message": c.message, "finish_reason": c.finish_reason, "logprobs": c.logprobs}
                   for k, c in enumerate((first, *self.more_choices))]
        return {**self._head("chat.completion"), "choices": choices, "usage": self.usage()}

    def chunks(self) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of the stream, in order (see the module docstring).

        Each chunk carries one choice, named by its ``index``; with ``n > 1`` the choices follow one
        another (all of choice 0, its finish chunk, then choice 1, ...), and the usage chunk comes last.
        """
        extra = {"usage": None} if self.include_usage else {}

        def chunk(index: int, delta: dict[str, Any], logprobs: dict[str, Any] | None,
                  finish_reason: str | None) -> dict[str, Any]:
            return {**self._head("chat.completion.chunk"), **extra,
                    "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}]}

        out: list[dict[str, Any]] = []
        for k, choice in enumerate((Choice(self.message, self.finish_reason, self.logprobs), *self.more_choices)):
            out += [chunk(k, d, None, None) for d in message_deltas(choice.message)]
            out.append(chunk(k, {}, choice.logprobs, choice.finish_reason))
        if self.include_usage:
            out.append({**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage()})
        return out

    def events(self) -> list[str]:
        """The server-sent events of the stream: ``data: {chunk}`` each, then ``data: [DONE]``."""
        return [f"data: {json.dumps(c)}\n\n" for c in self.chunks()] + ["data: [DONE]\n\n"]


def message_deltas(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message as the ``delta`` objects of its stream, in order.

    The role first, then the reasoning and the content in word-sized pieces, then each tool call as a
    delta with its id and name and one with its arguments; merged in order they give ``message``.
    """
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    deltas += [{"reasoning_content": p} for p in text_pieces(message.get("reasoning_content") or "")]
    deltas += [{"content": p} for p in text_pieces(message.get("content") or "")]
    for k, call in enumerate(message.get("tool_calls") or []):
        fn = call["function"]
        deltas.append({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                       "function": {"name": fn["name"], "arguments": ""}}]})
        deltas.append({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
    return deltas


def text_pieces(text: str) -> list[str]:
    """``text`` cut into word-sized deltas (each word with the whitespace before it); they join to ``text``."""
    return _PIECE.findall(text)


def logprobs_content(token_texts: Sequence[str], logprobs: Sequence[float],
                     alternatives: Sequence[Sequence[tuple[str, float]]] | None = None) -> dict[str, Any]:
    """The ``logprobs`` object of a choice: one entry per sampled token.

    Args:
        token_texts: ``(n,)`` each sampled token's text (special tokens kept).
        logprobs: ``(n,)`` the behaviour log-probabilities (nats) of the sampled tokens, under the
            rollout's sampling transform (temperature, top-k, top-p): what the learner's ratio uses.
        alternatives: ``(n,)`` per token its most likely ``(text, log-probability)`` pairs under the same
            transform (``top_logprobs``), or None for none.

    Returns:
        ``{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}, ...]},
        ...]}``.
    """
    def entry(text: str, logprob: float) -> dict[str, Any]:
        return {"token": text, "logprob": float(logprob), "bytes": list(text.encode("utf-8"))}

    tops = alternatives if alternatives is not None else [()] * len(token_texts)
    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, alp) for a, alp in top]}
                        for t, lp, top in zip(token_texts, logprobs, tops, strict=True)]}
