"""Token-in, token-out chat rendering with a Hugging Face tokenizer's chat template.

A trajectory is kept as the exact token ids the engine conditioned on and produced. The rollout
loop builds it as::

    ids = renderer.initial_prompt(task, system=env.system_prompt, tools=env.tools)
    ids += sampled_ids                      # the reply, ending with an end-of-turn token
    ids += renderer.observation_tokens(env.observation_role, observation)
    ids += sampled_ids_2 ...

Sampled ids are never decoded and re-encoded (different id sequences can decode to the same text,
so re-encoding drifts). Only environment text is tokenized, and only as a *delta*: the observation
message is rendered with the template twice, in a conversation with and without it, and the
suffix is taken. That is sound only when the template is append-only for this step (the *prefix
property*: rendering the longer conversation starts with the shorter one, up to the end of the
assistant's end-of-turn token). When a template breaks it (Qwen3 drops earlier ``<think>`` blocks
once a new user message follows), :meth:`ChatRenderer.observation_tokens` raises
:class:`~agentenv.errors.TemplateError` and counts the event in ``template_errors``; the caller
ends the episode rather than train on ids the model would never see.

The delta is cut right after the previous assistant turn's end-of-turn token, so template
artefacts (a default system prompt, a BOS text, the base conversation) are never part of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentenv.errors import ConfigError, TemplateError

_SENTINEL = "\u2063agentenv-reply\u2063"  # invisible separator marks the assistant content
_BASE_USER = "\u2063agentenv-user\u2063"
_CONTENT = "\u2063agentenv-content\u2063"  # stands in for untrusted text that holds special-token strings


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

    Raises:
        TemplateError: No template is given and the tokenizer has none, or the template does not
            mark an end of the assistant turn.
        ConfigError: Unknown ``on_prefix_violation``.
    """

    def __init__(
        self, tokenizer: Any, chat_template: str | None = None, *, on_prefix_violation: str = "raise"
    ) -> None:
        if on_prefix_violation not in ("raise", "append"):
            raise ConfigError(f"on_prefix_violation must be 'raise' or 'append', got {on_prefix_violation!r}")
        self.on_prefix_violation = on_prefix_violation
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
        parts = text.split(_CONTENT)
        if len(parts) != 2:
            raise TemplateError(
                f"the template rendered the message content {len(parts) - 1} times, expected once"
            )
        self.protected_texts += 1
        body = list(self.tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        return self._encode(parts[0]) + body + self._encode(parts[1])

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

    def decode(self, ids: Sequence[int], *, keep_special: bool = False) -> str:
        """Text of ``ids`` for the environment (tool-call parsing, grading) and logs.

        Args:
            ids: ``(N,)`` token ids.
            keep_special: Keep special tokens such as ``<|im_end|>`` (for logs and tests); by
                default they are dropped, so a reply's end-of-turn token is not part of its text.
                Tool-call tags stay either way (Qwen's ``<tool_call>`` is an added, non-special token).
        """
        return self.tokenizer.decode(list(ids), skip_special_tokens=not keep_special)
