"""One agent episode behind the OpenAI-compatible endpoint: requests in, exact token rows out.

An :class:`AgentSession` turns the chat-completion requests of one episode into trajectories. The
first request's messages are rendered with the model's chat template (:meth:`ChatRenderer.conversation_from`);
each later request that *extends* the history (the earlier messages, our replies as we returned them,
then new tool or user messages) appends only the new messages' delta, rendered against the real
history (:meth:`Conversation.observe_messages`), so the row holds exactly the ids the engine
conditioned on and sampled, with the sampler's log-probabilities and per-segment versions.

Where the token prefix cannot hold, it is counted, never an exception:

* the template renders the real history differently (Qwen3's ``<think>`` removal): counted in
  ``info["prefix_violations"]`` and handled by ``rollout.on_prefix_violation`` (``append`` keeps one
  row, ``split`` starts a new sample), exactly as for any environment;
* the agent *rewrote* its history (dropped, edited or reordered earlier messages, changed the tools,
  inserted an assistant message of its own): no single row can hold what the model saw, so a new
  sample starts from the template's rendering of the request; counted in ``info["history_rewrites"]``.

The agent's own sampling settings (``temperature``, ``top_p``) are replaced by the rollout's: the
learner scores the policy under the rollout's sampling transform, so the behaviour log-probabilities
must come from it (each request that asked otherwise is counted in ``info["sampling_overrides"]``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentenv.agents.openai_format import Choice, ServedReply, logprobs_content
from agentenv.engines.base import MAX_TOP_LOGPROBS, GenerationEngine, GenerationOutput, SamplingParams
from agentenv.errors import EngineError, TemplateError
from agentenv.rollout.episode import TOKEN_BUDGET_ENDINGS, RolloutConfig, append_output, turn_ending
from agentenv.rollout.tool_calls import ForcedCallParser
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.rollout.chat import ChatRenderer
    from agentenv.rollout.tool_calls import ToolCallParser

ROLES = ("system", "developer", "user", "assistant", "tool")


class OpenAIError(Exception):
    """A request refused with an OpenAI-style error body ``{"error": {message, type, param, code}}``.

    Attributes:
        status: HTTP status (400 bad request, 401 no session key, 404 unknown model or session,
            409 session closed, 500 engine failure).
    """

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type_: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code, self.param, self.type = status, code, param, type_

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": str(self), "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    """A 400 :class:`OpenAIError` about ``param``."""
    return OpenAIError(400, message, code=code, param=param)


def content_text(content: Any, where: str, kinds: tuple[str, ...] = ("text",)) -> str:
    """A message's content as text: a string, a list of text parts (of the types ``kinds``), or None (empty).

    Raises:
        OpenAIError: A part of another type, or content of another kind (400, param ``where``).
    """
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
                raise bad_request(f"{where}: only text content parts ({', '.join(kinds)}) are supported", where)
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"{where}: content must be a string, a list of text parts or null", where)


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # kept verbatim: the model wrote it so
    if isinstance(raw, Mapping):
        return dict(raw)
    raise bad_request(f"{where}: function.arguments must be a JSON string", where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated messages in one canonical form (what is compared to tell an extension from a rewrite).

    Keys: ``role``, ``content`` (text), and ``tool_calls`` (``[{id, name, arguments}]``) for an
    assistant, ``tool_call_id`` for a tool result; ``developer`` reads as ``system``.

    Raises:
        OpenAIError: Not a non-empty list of messages with known roles and text content (400).
    """
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise bad_request(f"{where}: role must be one of {', '.join(ROLES)}", where)
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": content_text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise bad_request(f"{where}: tool_calls must be an array", where)
            msg["tool_calls"] = []
            for c in calls:
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise bad_request(f"{where}: each tool call needs function.name", where)
                msg["tool_calls"].append({"id": c.get("id"), "name": fn["name"],
                                          "arguments": _arguments(fn.get("arguments", "{}"), where)})
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad_request(f"{where}: a tool message needs tool_call_id", where)
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def validate_tools(tools: Any) -> list[dict[str, Any]]:
    """The request's ``tools`` (function tools with a JSON-schema ``parameters`` object), or ``[]``.

    Raises:
        OpenAIError: Not an array of ``{"type": "function", "function": {"name", "parameters"}}``, or a
            ``parameters`` that is not a valid JSON schema (400, param ``tools``).
    """
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("tools must be an array", "tools")
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, Mapping) else None
        if t.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            shape = "{'type': 'function', 'function': {'name': ..., 'parameters': ...}}"
            raise bad_request(f"{where}: expected {shape}", where)
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise bad_request(f"{where}: function.parameters must be a JSON schema object", where, "invalid_schema")
        try:
            import jsonschema
        except ImportError:  # without jsonschema only the shape is checked
            continue
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as exc:
            raise bad_request(f"{where}: function.parameters is not a valid JSON schema: {exc.message}", where,
                              "invalid_schema") from None
    return [dict(t) for t in tools]


#: Most choices one request may ask for (``n``).
MAX_CHOICES = 8


@dataclass(frozen=True)
class ToolChoice:
    """The request's ``tool_choice``.

    Attributes:
        mode: ``"auto"`` (calls parsed as the model writes them), ``"none"`` (the reply is content,
            never a call), ``"required"`` (the reply is forced to open a call; the model names the
            tool) or ``"function"`` (forced to open a call of ``name``).
        name: The function of mode ``"function"``.
    """

    mode: str = "auto"
    name: str | None = None

    @property
    def forces_call(self) -> bool:
        """The reply starts with a forced call opening."""
        return self.mode in ("required", "function")

    @classmethod
    def read(cls, value: Any, tools: Sequence[Mapping[str, Any]]) -> ToolChoice:
        """Validate ``tool_choice`` against the request's tools.

        Raises:
            OpenAIError: Not ``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function",
                "function": {"name": ...}}``; ``"required"`` without tools; a function that is not
                among the tools (400, param ``tool_choice``).
        """
        if value is None or value in ("auto", "none"):
            return cls(value or "auto")
        names = [t["function"]["name"] for t in tools]
        if value == "required":
            if not names:
                raise bad_request("tool_choice='required' needs tools", "tool_choice")
            return cls("required")
        fn = value.get("function") if isinstance(value, Mapping) and value.get("type") == "function" else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise bad_request("tool_choice must be 'none', 'auto', 'required' or "
                              "{'type': 'function', 'function': {'name': ...}}", "tool_choice")
        if fn["name"] not in names:
            raise bad_request(f"tool_choice names the function {fn['name']!r}, which is not among the request's tools "
                              f"({', '.join(names) or 'none'})", "tool_choice")
        return cls("function", fn["name"])


@dataclass(frozen=True)
class RequestOptions:
    """What a request asks of the reply besides its messages and tools.

    Attributes:
        stream: Write the reply as server-sent events (:meth:`ServedReply.events`).
        include_usage: ``stream_options.include_usage``: a last chunk with the usage.
        logprobs: Return the sampled tokens' log-probabilities.
        max_tokens: ``max_completion_tokens`` (or ``max_tokens``): at most this many tokens.
        tool_choice: See :class:`ToolChoice`.
        n: Choices to sample, each its own sample (trajectory) of the episode.
    """

    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    max_tokens: int | None = None
    tool_choice: ToolChoice = ToolChoice()
    n: int = 1
    top_logprobs: int = 0

    @classmethod
    def read(cls, body: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> RequestOptions:
        """Validate the options of a request body.

        Raises:
            OpenAIError: A field of the wrong type, ``n`` outside [1, :data:`MAX_CHOICES`] (400
                ``invalid_value``); ``top_logprobs`` outside [0, :data:`MAX_TOP_LOGPROBS`], or above 0
                without ``logprobs=true`` (400 ``invalid_value``).
        """
        flags = {}
        for key in ("stream", "logprobs"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise bad_request(f"{key} must be a boolean", key)
            flags[key] = bool(body.get(key))
        stream_options = body.get("stream_options")
        if stream_options is not None and not isinstance(stream_options, Mapping):
            raise bad_request("stream_options must be an object", "stream_options")
        include_usage = bool((stream_options or {}).get("include_usage"))
        n = 1 if body.get("n") is None else body["n"]
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
            raise bad_request(f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}", "n")
        top = body.get("top_logprobs")
        if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS):
            raise bad_request(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
        if top and not flags["logprobs"]:
            raise bad_request("top_logprobs needs logprobs=true", "top_logprobs")
        requested = body.get("max_completion_tokens", body.get("max_tokens"))
        if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int) or requested < 1):
            raise bad_request("max_tokens must be an integer >= 1", "max_tokens")
        return cls(stream=flags["stream"], include_usage=include_usage, logprobs=flags["logprobs"],
                   max_tokens=requested, tool_choice=ToolChoice.read(body.get("tool_choice"), tools), n=n,
                   top_logprobs=top or 0)


def _extends(state: Mapping[str, Any], norm: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
    """Whether a request (``norm``, ``tools``) extends the history of a line (an ``AgentSession._BRANCH`` state).

    It does when the tools are the same and the messages are the line's history as the agent was
    shown it, then only new tool or user messages after the line's open reply.
    """
    seen = state["_seen"]
    return (state["_conv"] is not None and state["_reply_open"] and tools == state["_tools"]
            and len(norm) > len(seen) and norm[: len(seen)] == seen
            and all(m["role"] != "assistant" for m in norm[len(seen):]))


def _template_message(m: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    """The form a chat template reads (tool calls as ``{"type": "function", "function": {...}}``)."""
    out: dict[str, Any] = {"role": m["role"], "content": m["content"]}
    if m.get("tool_calls"):
        out["tool_calls"] = [{"id": c["id"], "type": "function",
                              "function": {"name": c["name"], "arguments": c["arguments"]}} for c in m["tool_calls"]]
    if m["role"] == "tool":
        out["tool_call_id"] = m["tool_call_id"]
        if m["tool_call_id"] in names:
            out["name"] = names[m["tool_call_id"]]
    return out


class AgentSession:
    """The requests of one episode and the samples they make (see the module docstring).

    Args:
        session_id: The key the agent sends (its API key).
        engine: Generates the replies.
        renderer: The policy's :class:`~agentenv.rollout.chat.ChatRenderer`.
        cfg: Budgets (per reply, per episode), sampling and ``on_prefix_violation``.
        parser: Reads tool calls out of reply text (``agentenv.rollout.tool_calls``).
        version_fn: The learner's policy version (a sample's start version).

    Attributes:
        samples: Finished and current samples, in order (each a :class:`Trajectory`).
        info: Counters: ``turns`` (requests served), ``turn_endings``, ``tool_calls``,
            ``prefix_violations``, ``history_rewrites``, ``sampling_overrides``,
            ``forced_call_openings`` (replies a ``tool_choice`` forced to open a call),
            ``extra_choices`` (choices beyond the first of ``n > 1`` requests), ``truncation``.
        log: ``(prompt_ids, GenerationOutput)`` of every engine call, in order.
        closed: The episode ended; every later request is refused (409).
    """

    def __init__(self, session_id: str, engine: GenerationEngine, renderer: ChatRenderer, cfg: RolloutConfig,
                 parser: ToolCallParser, version_fn: Callable[[], int]) -> None:
        self.id = session_id
        self.engine, self.renderer, self.cfg, self.parser = engine, renderer, cfg, parser
        self.version_fn = version_fn
        self.samples: list[Trajectory] = []
        self.info: dict[str, Any] = {"turns": 0, "turn_endings": [], "tool_calls": 0, "prefix_violations": 0,
                                     "history_rewrites": 0, "sampling_overrides": 0, "forced_call_openings": 0,
                                     "extra_choices": 0, "truncation": None}
        self.log: list[tuple[list[int], GenerationOutput]] = []
        self.closed = False
        self.lock = asyncio.Lock()
        self._conv: Any = None
        self._seen: list[dict[str, Any]] = []  # the history as the agent sees it (normalized)
        self._tools: list[dict[str, Any]] = []
        self._names: dict[str, str] = {}  # tool call id -> tool name
        self._reply_open = False  # the last reply has no observation yet
        self._cut = False  # the last reply ended without its end-of-turn token
        self._used = 0  # budget tokens spent after the first prompt (tokens)
        self._row: Trajectory | None = None  # the sample the conversation continues
        self._alternatives: list[dict[str, Any]] = []  # the other choices of an n > 1 reply (_BRANCH state)

    #: The state of one line of the conversation; an ``n > 1`` reply makes one line per choice.
    _BRANCH = ("_conv", "_row", "_seen", "_tools", "_reply_open", "_cut", "_used")

    @property
    def traj(self) -> Trajectory | None:
        """The current sample (the one the next request continues)."""
        return self._row

    def _snapshot(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._BRANCH}

    def _restore(self, state: Mapping[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)

    @staticmethod
    def _fork(state: Mapping[str, Any]) -> dict[str, Any]:
        """An independent copy of a line's state (the copy of its row is a new sample, with its own id)."""
        row = copy.deepcopy(state["_row"])
        row.id = uuid.uuid4().hex
        return {**state, "_conv": state["_conv"].fork(), "_row": row, "_seen": list(state["_seen"])}

    def _new_sample(self, prompt: list[int]) -> None:
        last = self.traj
        if last is not None:
            self._used += max(0, len(prompt) - len(last.token_ids))  # new history beyond the old row
        traj = Trajectory(start_version=self.version_fn(), start_time=time.time())
        traj.append_environment_tokens(prompt)
        traj.prompt_length = len(prompt)
        self.samples.append(traj)
        self._row = traj

    def _append_env(self, ids: list[int]) -> None:
        assert self.traj is not None
        self.traj.append_environment_tokens(ids)
        self._used += len(ids)

    def _prepare(self, norm: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        """Bring the current row up to the request's history (extend, or start a new sample).

        After an ``n > 1`` reply the history may extend any of its choices: the line of that choice
        is continued (the others stay samples of their own).
        """
        chosen = next((alt for alt in self._alternatives if _extends(alt, norm, tools)), None)
        if chosen is not None and not _extends(self._snapshot(), norm, tools):
            self._restore(chosen)
        self._alternatives = []
        k = len(self._seen)
        if self._conv is not None and not self._reply_open and norm == self._seen and tools == self._tools:
            return  # a retry of a request that got no reply (an error): the row is ready
        if _extends(self._snapshot(), norm, tools):
            closing = [self.renderer.end_of_turn_id] if self._cut else []
            new = [_template_message(m, self._names) for m in norm[k:]]
            delta = self._conv.observe_messages(new, policy=self.cfg.on_prefix_violation)
            self.info["prefix_violations"] += not delta.prefix_ok
            if delta.restart:
                self._append_env(closing)
                self._new_sample(list(delta.ids))
            else:
                self._append_env(closing + list(delta.ids))
        else:
            if self._conv is not None:
                self.info["history_rewrites"] += 1
                if self._cut:
                    self._append_env([self.renderer.end_of_turn_id])
            self._conv = self.renderer.conversation_from([_template_message(m, self._names) for m in norm],
                                                         tools=tools)
            self._new_sample(list(self._conv.prompt_ids))
        self._seen, self._tools, self._reply_open = list(norm), tools, False

    async def complete(self, body: Mapping[str, Any], model: str) -> ServedReply:
        """Serve one ``/v1/chat/completions`` request body; return the reply to write.

        Raises:
            OpenAIError: The session ended (409), a bad field (400), a ``max_tokens`` beyond what the
                episode has left (400, code ``max_tokens_exceeded``), the episode's token budget or the
                context spent (400, code ``context_length_exceeded``), the engine or the template
                failed (500). The session's samples stay consistent: nothing is appended for a
                refused request, and a retry of the same messages continues the same row.
        """
        async with self.lock:
            if self.closed:
                raise OpenAIError(409, f"session {self.id} has ended (its episode is over)", code="session_closed")
            norm = normalize_messages(body.get("messages"))
            tools = validate_tools(body.get("tools"))
            options = RequestOptions.read(body, tools)
            if options.tool_choice.forces_call and not isinstance(self.parser, ForcedCallParser):
                parser = type(self.parser).__name__
                raise bad_request(f"tool_choice={body.get('tool_choice')!r} needs a tool-call format whose calls can "
                                  f"be forced open (hermes, qwen3); this model's parser is {parser}",
                                  "tool_choice", "unsupported_value")
            for key, ours in (("temperature", self.cfg.temperature), ("top_p", self.cfg.top_p)):
                if body.get(key) is not None and body[key] != ours:
                    self.info["sampling_overrides"] += 1
                    break
            try:
                self._prepare(norm, tools)
            except TemplateError as exc:
                raise OpenAIError(500, f"chat template: {exc}", code="template_error", type_="server_error") from exc
            traj = self.traj
            assert traj is not None
            forced = self._forced_opening(options.tool_choice)
            context_left = self.engine.max_context_tokens - len(traj.token_ids) - len(forced)
            left = min(self.cfg.max_total_tokens - self._used - len(forced), context_left)
            if left <= 0:
                self.info["truncation"] = "context" if context_left <= 0 else "max_total_tokens"
                raise OpenAIError(400, "the episode's token budget is spent (rollout.max_total_tokens or the "
                                  "model's context)", code="context_length_exceeded", param="messages")
            requested = options.max_tokens
            if requested is not None and requested > left:
                raise bad_request(f"max_tokens={requested} exceeds the {left} tokens this episode has left",
                                  "max_tokens", "max_tokens_exceeded")
            budget = min(self.cfg.max_new_tokens_per_turn, left, requested or self.cfg.max_new_tokens_per_turn)
            params = SamplingParams(max_new_tokens=budget, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                    top_k=self.cfg.top_k, stop_token_ids=tuple(self.renderer.stop_token_ids),
                                    top_logprobs=options.top_logprobs)
            prompt = [*traj.token_ids, *forced]
            try:
                outs = await asyncio.gather(*(self.engine.generate(prompt, params) for _ in range(options.n)))
            except EngineError as exc:
                raise OpenAIError(500, f"engine: {exc}", code="engine_error", type_="server_error") from exc
            if options.top_logprobs and any(o.top_logprobs is None for o in outs):
                raise OpenAIError(500, f"the engine ({type(self.engine).__name__}) returns no top_logprobs",
                                  code="engine_error", type_="server_error")
            self._append_env(forced)  # only once the engine served the request: a refusal leaves the row as it was
            self.info["turns"] += 1
            self.info["forced_call_openings"] += bool(forced)
            self.info["extra_choices"] += options.n - 1
            base = self._fork(self._snapshot()) if options.n > 1 else {}  # the line before any reply
            choices = [self._take(prompt, outs[0], forced, options, budget, context_left, 0)]
            live = self._snapshot()
            for k, out in enumerate(outs[1:], start=1):  # each other choice: a sample of its own
                self._restore(self._fork(base))
                self.samples.append(self._row)
                choices.append(self._take(prompt, out, forced, options, budget, context_left, k))
                self._alternatives.append(self._snapshot())
            self._restore(live)
            return ServedReply(id=f"chatcmpl-{uuid.uuid4().hex}", created=int(time.time()), model=model,
                               message=choices[0].message, finish_reason=choices[0].finish_reason,
                               prompt_tokens=len(prompt), completion_tokens=sum(len(o.token_ids) for o in outs),
                               version=max((o.spans[-1].version for o in outs if o.spans), default=self.engine.version),
                               logprobs=choices[0].logprobs, more_choices=tuple(choices[1:]), stream=options.stream,
                               include_usage=options.include_usage)

    def _take(self, prompt: list[int], out: GenerationOutput, forced: list[int], options: RequestOptions,
              budget: int, context_left: int, index: int) -> Choice:
        """Record one sampled reply in the current line and return it as a choice."""
        assert self._row is not None
        append_output(self._row, out)
        self.log.append((prompt, out))
        self._used += len(out.token_ids)
        ending = turn_ending(out, tuple(self.renderer.stop_token_ids), budget=budget,
                             per_turn=self.cfg.max_new_tokens_per_turn, context_left=context_left)
        if index == 0:
            self.info["turn_endings"].append(ending)
        self._cut = not (out.token_ids and out.token_ids[-1] in self.renderer.stop_token_ids)
        text = self._conv.add_reply([*forced, *out.token_ids])
        message, finish = self._message(text, ending, parse_calls=options.tool_choice.mode != "none", choice=index)
        self._seen.append(normalize_messages([message])[0])
        self._reply_open = True
        logprobs = None
        if options.logprobs:
            def text(t: int) -> str:
                return self.renderer.decode([t], keep_special=True)
            alternatives = None
            if options.top_logprobs:
                assert out.top_logprobs is not None  # checked before anything was recorded
                alternatives = [[(text(i), lp) for i, lp in top] for top in out.top_logprobs]
            logprobs = logprobs_content([text(t) for t in out.token_ids], out.logprobs, alternatives)
        return Choice(message, finish, logprobs)

    def _forced_opening(self, choice: ToolChoice) -> list[int]:
        """The ids of the call opening ``tool_choice`` forces (``[]`` for ``auto`` and ``none``)."""
        if not choice.forces_call:
            return []
        assert isinstance(self.parser, ForcedCallParser)
        text = self.parser.call_opening(choice.name)
        return list(self.renderer.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _message(self, text: str, ending: str, *, parse_calls: bool = True,
                 choice: int = 0) -> tuple[dict[str, Any], str]:
        """The assistant message of a reply: content, parsed tool calls, reasoning; and its finish reason.

        ``parse_calls=False`` (``tool_choice="none"``): the reply is content as written, never a call.
        ``choice``: the reply's index among the request's ``n`` choices (its calls' ids name it).
        """
        parsed = self.parser.parse(text)
        calls = []
        turn = f"{self.info['turns']}" + (f"c{choice}" if choice else "")
        for k, call in enumerate(parsed.calls if parse_calls else ()):
            call_id = f"call_{self.id[-8:]}_{turn}_{k}"
            self._names[call_id] = call.name
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))}})
        self.info["tool_calls"] += len(calls)
        # a malformed call stays in the content, so the agent sees what the model wrote
        content = text.strip() if not parse_calls else text if parsed.errors else parsed.content.strip()
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if parsed.reasoning and parse_calls:
            message["reasoning_content"] = parsed.reasoning
        finish = "tool_calls" if calls else "length" if ending in TOKEN_BUDGET_ENDINGS else "stop"
        return message, finish


def finish_samples(samples: Sequence[Trajectory], info: Mapping[str, Any], *, reward: float, status: str,
                   version: int) -> None:
    """Give an episode's samples its reward, status, completion version and info (``sample``/``samples`` when split)."""
    for i, s in enumerate(samples):
        s.reward, s.status = reward, status
        s.completion_version, s.completion_time = version, time.time()
        s.task_id = str(info.get("task_id", s.task_id))
        s.info = dict(info) if len(samples) == 1 else {**info, "sample": i, "samples": len(samples)}
