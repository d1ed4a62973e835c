"""Token-in, token-out chat rendering with a Hugging Face tokenizer's chat template.

A trajectory is kept as the exact token ids the engine conditioned on and produced. The rollout
loop builds it as::

    ids = renderer.initial_prompt(task, system=env.system_prompt, tools=env.tools)
    ids += sampled_ids                      # the reply, ending with an end-of-turn token
    ids += renderer.observation_tokens(env.observation_role, observation)
    ids += sampled_ids_2 ...

Sampled ids are never decoded and re-encoded (different id sequences can decode to the same text,
so re-encoding drifts). Only environment text is tokenized, and only as a *delta*.

:meth:`ChatRenderer.conversation` is the exact path the rollout loop takes: a :class:`Conversation`
keeps the episode's real messages (the decoded replies included) and the text the model conditioned
on. Each observation is rendered against that real history: the template renders the conversation
with and without the new message, and the delta is what follows the last assistant turn's
end-of-turn token. The *prefix property* holds when the template renders the real history exactly
as the model saw it (Qwen3's template breaks it: it drops earlier ``<think>`` blocks once a new user
message follows, and the prompt of thinking-off turns carries empty think tags that the history no
longer shows). A violation is counted (``Conversation.violations``, ``ChatRenderer.template_errors``)
and handled by a named policy, never an exception:

* ``"append"``: keep the ids the model conditioned on and append the delta (the observation
  rendered against the real history); the row is what the model saw, not what the template would
  render for the history today.
* ``"split"``: end the sample at this reply and start a new one whose prompt is the template's
  rendering of the real history (:attr:`ObservationDelta.restart`); each sample is then exactly
  what the template renders, at the price of more, shorter rows.

The delta is cut right after the previous assistant turn's end-of-turn token, so template
artefacts (a default system prompt, a BOS text, the base conversation) are never part of it.
:meth:`ChatRenderer.observation_tokens` is the older, history-free path (a placeholder history), kept
for callers that have no conversation.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentenv.errors import ConfigError, TemplateError

_SENTINEL = "\u2063agentenv-reply\u2063"  # invisible separator marks the assistant content
_BASE_USER = "\u2063agentenv-user\u2063"
_CONTENT = "\u2063agentenv-content\u2063"  # stands in for untrusted text that holds special-token strings

#: What a :class:`Conversation` does when the template does not render the real history as the model
#: saw it (see the module docstring).
PrefixPolicy = Literal["append", "split"]
PREFIX_POLICIES: tuple[str, ...] = ("append", "split")


class ChatRenderer:
    """Renders prompts and observation deltas as token ids.

    Args:
        tokenizer: A Hugging Face tokenizer (``apply_chat_template``, ``__call__``, ``decode``).
        chat_template: Jinja template to use instead of the tokenizer's own (e.g. a tool-aware
            ChatML template for a model whose bundled one ignores tools).
        on_prefix_violation: What :meth:`observation_tokens` does when adding the message changes
            how the template renders earlier turns (counted in ``template_errors`` either way):
            ``"raise"`` a :class:`~agentenv.errors.TemplateError`, or ``"append"``: keep the ids the
            model conditioned on and append the text that follows the assistant turn's end-of-turn
            token in the longer rendering (Qwen3 adds empty think tags to the last assistant turn
            only; history is never re-rendered, so only the delta matters).
        template_kwargs: Extra variables for the template, e.g. ``{"enable_thinking": False}`` for
            Qwen3's thinking-off mode.

    Raises:
        TemplateError: No template is given and the tokenizer has none, or the template does not
            mark an end of the assistant turn.
        ConfigError: Unknown ``on_prefix_violation``.
    """

    def __init__(
        self,
        tokenizer: Any,
        chat_template: str | None = None,
        *,
        on_prefix_violation: str = "raise",
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if on_prefix_violation not in ("raise", "append"):
            raise ConfigError(f"on_prefix_violation must be 'raise' or 'append', got {on_prefix_violation!r}")
        self.on_prefix_violation = on_prefix_violation
        self.template_kwargs = dict(template_kwargs or {})
        self.tokenizer = tokenizer
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            raise TemplateError("the tokenizer has no chat template and none was given")
        self.template_errors = 0  #: prefix-property violations seen by :meth:`observation_tokens`
        self.protected_texts = 0  #: task/observation texts that held special-token strings (kept as text)
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        self._special_strings = frozenset(getattr(tokenizer, "all_special_tokens", []) or []) | frozenset(
            t.content for t in added.values() if getattr(t, "special", False)
        )
        self._eot_text, self.end_of_turn_id = self._find_end_of_turn()

    # -- rendering helpers ------------------------------------------------------------------------
    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> str:
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=[dict(t) for t in tools] or None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja errors, raise_exception() in templates
            raise TemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
        if not isinstance(text, str):
            raise TemplateError(f"apply_chat_template returned {type(text).__name__}, expected str")
        return text

    def _encode(self, text: str) -> list[int]:
        """Tokenize template text (never sampled text) without adding special tokens."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _encode_holding(self, text: str, content: str) -> list[int]:
        """Tokenize ``text`` (rendered with :data:`_CONTENT` in place of ``content``) with ``content``.

        ``content`` is tokenized with special-token strings split into plain text, so a tool
        output that prints ``<|im_end|>`` cannot end a turn or forge a message.

        Raises:
            TemplateError: The template did not render the content exactly once.
        """
        if text.count(_CONTENT) != 1:
            raise TemplateError(
                f"the template rendered the message content {text.count(_CONTENT)} times, expected once"
            )
        self.protected_texts += 1
        return self._encode_masked(text, {_CONTENT: content})

    def _encode_masked(self, text: str, held: Mapping[str, str]) -> list[int]:
        """Tokenize ``text`` in which each key of ``held`` stands for untrusted text (kept as plain text)."""
        if not held:
            return self._encode(text)
        ids: list[int] = []
        pos = 0
        while True:
            hits = [(text.find(k, pos), k) for k in held]
            hits = [(i, k) for i, k in hits if i >= 0]
            if not hits:
                return ids + self._encode(text[pos:])
            at, key = min(hits)
            ids += self._encode(text[pos:at]) if at > pos else []
            ids += self.tokenizer(held[key], add_special_tokens=False, split_special_tokens=True)["input_ids"]
            pos = at + len(key)

    def _holds_special(self, content: str) -> bool:
        return any(s in content for s in self._special_strings)

    def _find_end_of_turn(self) -> tuple[str, int]:
        text = self._render(
            [{"role": "user", "content": _BASE_USER}, {"role": "assistant", "content": _SENTINEL}],
            add_generation_prompt=False,
        )
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise TemplateError("the chat template does not render assistant content")
        tail = text[at + len(_SENTINEL) :]
        ids = self._encode(tail) if tail else []
        specials = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        added = getattr(self.tokenizer, "added_tokens_decoder", {}) or {}
        if ids and (ids[0] in specials or ids[0] in added):
            return self.tokenizer.decode([ids[0]], skip_special_tokens=False), ids[0]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is None:
            raise TemplateError(f"cannot find the end-of-turn token after assistant content (tail {tail!r})")
        return "", int(eos)

    # -- public API -----------------------------------------------------------------------------
    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Ids that end a sampled reply: the template's end-of-turn token, then EOS if different."""
        ids = [self.end_of_turn_id]
        eos = getattr(self.tokenizer, "eos_token_id", None)
        if eos is not None and eos not in ids:
            ids.append(int(eos))
        return tuple(ids)

    def initial_prompt(
        self, user_text: str, *, system: str | None = None, tools: Sequence[Mapping[str, Any]] = ()
    ) -> list[int]:
        """Token ids of the first prompt, ending with the assistant generation prompt.

        Args:
            user_text: The task (the environment's ``reset`` observation).
            system: Optional system message.
            tools: Tool JSON schemas to advertise (rendered by the template).

        Returns:
            ``(P,)`` token ids, P = prompt length in tokens.

        Raises:
            TemplateError: The template failed to render.
        """
        protect = self._holds_special(user_text)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": _CONTENT if protect else user_text}
        ]
        text = self._render(messages, add_generation_prompt=True, tools=tools)
        return self._encode_holding(text, user_text) if protect else self._encode(text)

    def observation_tokens(self, role: str, content: str, *, previous_reply: str | None = None) -> list[int]:
        """Delta ids that render an observation message and open the next assistant turn.

        They are appended after the assistant's sampled reply, which must end with
        :attr:`end_of_turn_id` (append it yourself when a reply was cut by a token budget).

        Args:
            role: ``"tool"`` or ``"user"`` (the environment's ``observation_role``).
            content: The observation text.
            previous_reply: Decoded text of the reply just sampled, used only to check the prefix
                property against templates that rewrite earlier turns (it is never tokenized);
                a neutral placeholder when None.

        Returns:
            ``(D,)`` token ids, D = delta length in tokens. Special-token strings inside ``content``
            (e.g. a tool printing ``<|im_end|>``) are tokenized as plain text, never as control tokens.

        Raises:
            TemplateError: The template is not append-only here (counted in ``template_errors``)
                and ``on_prefix_violation`` is ``"raise"`` or the delta cannot be located, or the
                template failed to render.
        """
        reply = _SENTINEL if previous_reply is None else previous_reply + _SENTINEL
        base = [{"role": "user", "content": _BASE_USER}, {"role": "assistant", "content": reply}]
        short = self._render(base, add_generation_prompt=False)
        protect = self._holds_special(content)
        message = {"role": role, "content": _CONTENT if protect else content}
        long = self._render([*base, message], add_generation_prompt=True)
        at = short.rfind(_SENTINEL)
        cut = at + len(_SENTINEL)
        if at < 0 or not short.startswith(self._eot_text, cut):
            self.template_errors += 1
            raise TemplateError("the template does not end the assistant turn with its end-of-turn token")
        cut += len(self._eot_text)
        if long[:cut] != short[:cut]:
            self.template_errors += 1
            at_long = long.rfind(_SENTINEL)
            cut_long = at_long + len(_SENTINEL)
            if (
                self.on_prefix_violation == "append"
                and at_long >= 0
                and long.startswith(self._eot_text, cut_long)
            ):
                # Keep the ids the model conditioned on; append what follows the assistant turn.
                delta = long[cut_long + len(self._eot_text) :]
                return self._encode_holding(delta, content) if protect else self._encode(delta)
            diverge = (
                next(i for i, (a, b) in enumerate(zip(long, short, strict=False)) if a != b)
                if long[:cut]
                else 0
            )
            raise TemplateError(
                f"chat template is not append-only: adding a {role!r} message changes earlier text "
                f"at character {diverge} (...{short[max(0, diverge - 40) : diverge + 40]!r})"
            )
        return self._encode_holding(long[cut:], content) if protect else self._encode(long[cut:])

    @property
    def tool_parser_name(self) -> str | None:
        """The registered tool-call parser the template implies (``agentenv.rollout.tool_calls``), or None."""
        from agentenv.rollout.tool_calls import parser_for_template

        try:
            return parser_for_template(self.chat_template)
        except ConfigError:
            return None

    def conversation(
        self, user_text: str, *, system: str | None = None, tools: Sequence[Mapping[str, Any]] = ()
    ) -> Conversation:
        """Start one episode's :class:`Conversation`: the exact, history-aware path.

        Args:
            user_text: The task (the environment's ``reset`` observation).
            system: Optional system message.
            tools: Tool JSON schemas to advertise.

        Raises:
            TemplateError: The template failed to render.
        """
        return Conversation(self, user_text, system=system, tools=tools)

    def conversation_from(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] = ()
    ) -> Conversation:
        """A :class:`Conversation` whose prompt is any message list (an agent's request, few-shot turns).

        Args:
            messages: Chat messages (``role``, ``content`` and the template's other keys, e.g. an
                assistant's ``tool_calls`` or a tool result's ``tool_call_id``), rendered as given.
            tools: Tool JSON schemas to advertise.

        Raises:
            TemplateError: The template failed to render.
        """
        return Conversation(self, "", tools=tools, messages=messages)

    def decode(self, ids: Sequence[int], *, keep_special: bool = False) -> str:
        """Text of ``ids`` for the environment (tool-call parsing, grading) and logs.

        Args:
            ids: ``(N,)`` token ids.
            keep_special: Keep special tokens such as ``<|im_end|>`` (for logs and tests); by
                default they are dropped, so a reply's end-of-turn token is not part of its text.
                Tool-call tags stay either way (Qwen's ``<tool_call>`` is an added, non-special token).
        """
        return self.tokenizer.decode(list(ids), skip_special_tokens=not keep_special)


@dataclass(frozen=True)
class ObservationDelta:
    """The ids that follow a finished reply, from :meth:`Conversation.observe`.

    Attributes:
        ids: ``(D,)`` token ids. Normally the delta to append after the reply (the observation
            message and the next assistant prompt); with :attr:`restart`, the whole prompt of a new
            sample (the template's rendering of the real history plus the observation).
        prefix_ok: The template renders the real history exactly as the model conditioned on it.
        restart: Policy ``"split"`` and the prefix property failed: end the current sample at the
            reply and start a new one with :attr:`ids` as its prompt.
        divergence: Where the rendering first differs from the conditioned text (character index
            into the conditioned text), or None when ``prefix_ok``.
    """

    ids: list[int]
    prefix_ok: bool
    restart: bool = False
    divergence: int | None = None


class Conversation:
    """One episode's real messages and the exact text the model conditioned on.

    Built by :meth:`ChatRenderer.conversation`. Use::

        conv = renderer.conversation(task, system=..., tools=...)
        ids = conv.prompt_ids
        text = conv.add_reply(sampled_ids)           # text for the environment
        delta = conv.observe("tool", observation, policy="append")
        ids = ids + sampled_ids + delta.ids          # or start a new sample when delta.restart

    Attributes:
        prompt_ids: ``(P,)`` ids of the first prompt (ending with the assistant generation prompt).
        violations: Observations for which the prefix property failed (see the module docstring).
        restarts: Samples started by policy ``"split"``.
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        user_text: str,
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
        messages: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self._r = renderer
        self._tools = [dict(t) for t in tools]
        self._held: dict[str, str] = {}  # placeholder -> untrusted text holding special-token strings
        if messages is not None:  # ChatRenderer.conversation_from
            self._messages = [self._held_message(m) for m in messages]
        else:
            self._messages = [{"role": "system", "content": system}] if system else []
            self._messages.append({"role": "user", "content": self._hold(user_text)})
            if system and renderer._holds_special(system):
                self._messages[0]["content"] = self._hold(system)
        self._text = renderer._render(self._messages, add_generation_prompt=True, tools=self._tools)
        self.prompt_ids = renderer._encode_masked(self._text, self._held)
        self._reply_open = False
        self.violations = 0
        self.restarts = 0

    def fork(self) -> Conversation:
        """An independent copy of this conversation (the same renderer), to continue another way.

        The agents' endpoint forks a conversation for each choice of an ``n > 1`` reply.
        """
        other = copy.copy(self)
        other._tools = [dict(t) for t in self._tools]
        other._held = dict(self._held)
        other._messages = [dict(m) for m in self._messages]
        return other

    def _hold(self, content: str) -> str:
        if not self._r._holds_special(content):
            return content
        key = f"{_CONTENT}{len(self._held)}{_CONTENT}"
        self._held[key] = content
        self._r.protected_texts += 1
        return key

    def _held_message(self, message: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(message)
        if isinstance(out.get("content"), str):
            out["content"] = self._hold(out["content"])
        return out

    def add_reply(self, ids: Sequence[int]) -> str:
        """Record a sampled reply; return its text for the environment.

        Args:
            ids: ``(N,)`` the sampled ids; a trailing stop token (end of turn or EOS) is not part
                of the text. The caller keeps the ids (they are never re-encoded).

        Returns:
            The reply's text with special tokens kept (``[TOOL_CALLS]``, ``<|python_tag|>`` and the
            like are part of some families' tool-call formats), without the trailing stop token.

        Raises:
            TemplateError: The previous reply has no observation yet.
        """
        if self._reply_open:
            raise TemplateError("add_reply() twice without observe() in between")
        body = list(ids)
        if body and body[-1] in self._r.stop_token_ids:
            body = body[:-1]
        text = self._r.decode(body, keep_special=True)
        self._messages.append({"role": "assistant", "content": text})
        self._text += text
        self._reply_open = True
        return text

    def observe(self, role: str, content: str, *, policy: PrefixPolicy = "append") -> ObservationDelta:
        """Render an observation against the real history; the ids that follow the reply.

        Args:
            role: ``"tool"`` or ``"user"`` (the environment's ``observation_role``).
            content: The observation text (special-token strings in it stay plain text).
            policy: What to do when the prefix property fails (module docstring); counted in
                :attr:`violations` either way.

        Returns:
            An :class:`ObservationDelta`.

        Raises:
            TemplateError: No reply to follow, the template failed to render, or the end of the
                assistant turn cannot be found in the rendering.
            ConfigError: Unknown ``policy``.
        """
        return self.observe_messages([{"role": role, "content": content}], policy=policy)

    def observe_messages(self, messages: Sequence[Mapping[str, Any]], *,
                         policy: PrefixPolicy = "append") -> ObservationDelta:
        """:meth:`observe` for one or more messages after the reply (e.g. two tool results, then a user turn).

        Args:
            messages: Non-assistant chat messages (``role``, ``content``, and keys such as
                ``tool_call_id``), in order.
            policy: As :meth:`observe`.

        Returns:
            An :class:`ObservationDelta`.

        Raises:
            TemplateError: No reply to follow, the template failed to render, or the end of the
                assistant turn cannot be found in the rendering.
            ConfigError: Unknown ``policy``.
        """
        if policy not in PREFIX_POLICIES:
            raise ConfigError(f"prefix policy must be one of {PREFIX_POLICIES}, got {policy!r}")
        if not self._reply_open:
            raise TemplateError("observe() needs a reply first (add_reply)")
        r = self._r
        new = [self._held_message(m) for m in messages]
        marked = [*self._messages[:-1], {"role": "assistant", "content": self._messages[-1]["content"] + _SENTINEL}]
        long = r._render([*marked, *new], add_generation_prompt=True, tools=self._tools)
        at = long.rfind(_SENTINEL)
        if at >= 0 and long.startswith(r._eot_text, at + len(_SENTINEL)):
            rendered_prefix = long[:at]
            delta = long[at + len(_SENTINEL) + len(r._eot_text) :]
        else:  # the template drops or rewrites the reply: cut after as many turn ends as the history has
            real = r._render([*self._messages, *new], add_generation_prompt=True, tools=self._tools)
            turns = (self._text + r._eot_text).count(r._eot_text) if r._eot_text else 0
            cut = _after_nth(real, r._eot_text, turns) if turns else -1
            if cut < 0:
                r.template_errors += 1
                raise TemplateError("cannot find the end of the assistant turn in the template's rendering")
            rendered_prefix, delta = real[: cut - len(r._eot_text)], real[cut:]
        self._messages.extend(new)
        self._reply_open = False
        if rendered_prefix == self._text:
            self._text += r._eot_text + delta
            return ObservationDelta(r._encode_masked(delta, self._held), True)
        self.violations += 1
        r.template_errors += 1
        diverge = next(
            (i for i, (a, b) in enumerate(zip(rendered_prefix, self._text, strict=False)) if a != b),
            min(len(rendered_prefix), len(self._text)),
        )
        if policy == "append":
            self._text += r._eot_text + delta
            return ObservationDelta(r._encode_masked(delta, self._held), False, divergence=diverge)
        self.restarts += 1
        self._text = r._render(self._messages, add_generation_prompt=True, tools=self._tools)
        return ObservationDelta(r._encode_masked(self._text, self._held), False, restart=True, divergence=diverge)


def _after_nth(text: str, marker: str, n: int) -> int:
    """Index just past the ``n``-th occurrence of ``marker`` in ``text``, or -1."""
    pos = 0
    for _ in range(n):
        at = text.find(marker, pos)
        if at < 0:
            return -1
        pos = at + len(marker)
    return pos
