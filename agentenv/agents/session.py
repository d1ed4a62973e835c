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
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentenv.engines.base import GenerationEngine, GenerationOutput, SamplingParams
from agentenv.errors import EngineError, TemplateError
from agentenv.rollout import TOKEN_BUDGET_ENDINGS, RolloutConfig, append_output, turn_ending
from agentenv.trajectory import Trajectory

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


def _bad(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return OpenAIError(400, message, code=code, param=param)


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, a list of text parts, or None (empty)."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _bad(f"{where}: only text content parts are supported", where)
            parts.append(part["text"])
        return "".join(parts)
    raise _bad(f"{where}: content must be a string, a list of text parts or null", where)


def _arguments(raw: Any, where: str) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw  # kept verbatim: the model wrote it so
    if isinstance(raw, Mapping):
        return dict(raw)
    raise _bad(f"{where}: function.arguments must be a JSON string", where)


def normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Validated messages in one canonical form (what is compared to tell an extension from a rewrite).

    Keys: ``role``, ``content`` (text), and ``tool_calls`` (``[{id, name, arguments}]``) for an
    assistant, ``tool_call_id`` for a tool result; ``developer`` reads as ``system``.

    Raises:
        OpenAIError: Not a non-empty list of messages with known roles and text content (400).
    """
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty array", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping) or m.get("role") not in ROLES:
            raise _bad(f"{where}: role must be one of {', '.join(ROLES)}", where)
        role = "system" if m["role"] == "developer" else m["role"]
        msg: dict[str, Any] = {"role": role, "content": _text(m.get("content"), where)}
        if role == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list):
                raise _bad(f"{where}: tool_calls must be an array", where)
            msg["tool_calls"] = []
            for c in calls:
                fn = c.get("function") if isinstance(c, Mapping) else None
                if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                    raise _bad(f"{where}: each tool call needs function.name", where)
                msg["tool_calls"].append({"id": c.get("id"), "name": fn["name"],
                                          "arguments": _arguments(fn.get("arguments", "{}"), where)})
        if role == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise _bad(f"{where}: a tool message needs tool_call_id", where)
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
        raise _bad("tools must be an array", "tools")
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, Mapping) else None
        if t.get("type") != "function" or not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise _bad(f"{where}: expected {{'type': 'function', 'function': {{'name': ..., 'parameters': ...}}}}",
                       where)
        params = fn.get("parameters", {"type": "object"})
        if not isinstance(params, Mapping):
            raise _bad(f"{where}: function.parameters must be a JSON schema object", where, "invalid_schema")
        try:
            import jsonschema
        except ImportError:  # without jsonschema only the shape is checked
            continue
        try:
            jsonschema.validators.validator_for(params).check_schema(params)
        except jsonschema.SchemaError as exc:
            raise _bad(f"{where}: function.parameters is not a valid JSON schema: {exc.message}", where,
                       "invalid_schema") from None
    return [dict(t) for t in tools]


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
        renderer: The policy's :class:`~agentenv.chat.ChatRenderer`.
        cfg: Budgets (per reply, per episode), sampling and ``on_prefix_violation``.
        parser: Reads tool calls out of reply text (``agentenv.tool_calls``).
        version_fn: The learner's policy version (a sample's start version).

    Attributes:
        samples: Finished and current samples, in order (each a :class:`Trajectory`).
        info: Counters: ``turns`` (replies sampled), ``turn_endings``, ``tool_calls``,
            ``prefix_violations``, ``history_rewrites``, ``sampling_overrides``, ``truncation``.
        log: ``(prompt_ids, GenerationOutput)`` of every engine call, in order.
        closed: The episode ended; every later request is refused (409).
    """

    def __init__(self, session_id: str, engine: GenerationEngine, renderer: Any, cfg: RolloutConfig, parser: Any,
                 version_fn: Callable[[], int]) -> None:
        self.id = session_id
        self.engine, self.renderer, self.cfg, self.parser = engine, renderer, cfg, parser
        self.version_fn = version_fn
        self.samples: list[Trajectory] = []
        self.info: dict[str, Any] = {"turns": 0, "turn_endings": [], "tool_calls": 0, "prefix_violations": 0,
                                     "history_rewrites": 0, "sampling_overrides": 0, "truncation": None}
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

    @property
    def traj(self) -> Trajectory | None:
        """The current sample."""
        return self.samples[-1] if self.samples else None

    def _new_sample(self, prompt: list[int]) -> None:
        last = self.traj
        if last is not None:
            self._used += max(0, len(prompt) - len(last.token_ids))  # new history beyond the old row
        traj = Trajectory(start_version=self.version_fn(), start_time=time.time())
        traj.append_environment_tokens(prompt)
        traj.prompt_length = len(prompt)
        self.samples.append(traj)

    def _append_env(self, ids: list[int]) -> None:
        assert self.traj is not None
        self.traj.append_environment_tokens(ids)
        self._used += len(ids)

    def _prepare(self, norm: list[dict[str, Any]], tools: list[dict[str, Any]]) -> None:
        """Bring the current row up to the request's history (extend, or start a new sample)."""
        k = len(self._seen)
        if self._conv is not None and not self._reply_open and norm == self._seen and tools == self._tools:
            return  # a retry of a request that got no reply (an error): the row is ready
        extends = (self._conv is not None and self._reply_open and tools == self._tools and len(norm) > k
                   and norm[:k] == self._seen and all(m["role"] != "assistant" for m in norm[k:]))
        if extends:
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

    async def complete(self, body: Mapping[str, Any], model: str) -> dict[str, Any]:
        """Serve one ``/v1/chat/completions`` request body; return the response body.

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
            if body.get("stream"):
                raise _bad("stream=true is not supported by the agentenv endpoint", "stream", "unsupported_value")
            if body.get("n", 1) not in (1, None):
                raise _bad("n must be 1", "n", "unsupported_value")
            requested = body.get("max_completion_tokens", body.get("max_tokens"))
            if requested is not None and (isinstance(requested, bool) or not isinstance(requested, int)
                                          or requested < 1):
                raise _bad("max_tokens must be an integer >= 1", "max_tokens")
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
            context_left = self.engine.max_context_tokens - len(traj.token_ids)
            left = min(self.cfg.max_total_tokens - self._used, context_left)
            if left <= 0:
                self.info["truncation"] = "context" if context_left <= 0 else "max_total_tokens"
                raise OpenAIError(400, "the episode's token budget is spent (rollout.max_total_tokens or the "
                                  "model's context)", code="context_length_exceeded", param="messages")
            if requested is not None and requested > left:
                raise _bad(f"max_tokens={requested} exceeds the {left} tokens this episode has left", "max_tokens",
                           "max_tokens_exceeded")
            per_turn = self.cfg.max_new_tokens_per_turn
            budget = min(per_turn, left, requested or per_turn)
            params = SamplingParams(max_new_tokens=budget, temperature=self.cfg.temperature, top_p=self.cfg.top_p,
                                    top_k=self.cfg.top_k, stop_token_ids=tuple(self.renderer.stop_token_ids))
            prompt = list(traj.token_ids)
            try:
                out = await self.engine.generate(prompt, params)
                append_output(traj, out)
            except EngineError as exc:
                raise OpenAIError(500, f"engine: {exc}", code="engine_error", type_="server_error") from exc
            self.log.append((prompt, out))
            self._used += len(out.token_ids)
            ending = turn_ending(out, tuple(self.renderer.stop_token_ids), budget=budget, per_turn=per_turn,
                                 context_left=context_left)
            self.info["turns"] += 1
            self.info["turn_endings"].append(ending)
            self._cut = not (out.token_ids and out.token_ids[-1] in self.renderer.stop_token_ids)
            text = self._conv.add_reply(out.token_ids)
            message, finish = self._message(text, ending)
            self._seen.append(normalize_messages([message])[0])
            self._reply_open = True
            return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                    "model": model, "system_fingerprint": f"agentenv-v{out.spans[-1].version if out.spans else 0}",
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(out.token_ids),
                              "total_tokens": len(prompt) + len(out.token_ids)}}

    def _message(self, text: str, ending: str) -> tuple[dict[str, Any], str]:
        """The assistant message of a reply: content, parsed tool calls, reasoning; and its finish reason."""
        parsed = self.parser.parse(text)
        calls = []
        for k, call in enumerate(parsed.calls):
            call_id = f"call_{self.id[-8:]}_{self.info['turns']}_{k}"
            self._names[call_id] = call.name
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": call.name, "arguments": json.dumps(dict(call.arguments))}})
        self.info["tool_calls"] += len(calls)
        # a malformed call stays in the content, so the agent sees what the model wrote
        content = text if parsed.errors else parsed.content.strip()
        message: dict[str, Any] = {"role": "assistant", "content": content or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if parsed.reasoning:
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
