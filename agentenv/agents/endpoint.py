"""An OpenAI-compatible endpoint backed by the generation engine, served during rollout (Starlette on uvicorn).

Routes (``base_url`` is ``http://127.0.0.1:PORT/v1``):

* ``GET /v1/models`` and ``GET /v1/models/{model}``: the served model names.
* ``POST /v1/chat/completions``: one reply of the policy (with ``tools``; tool calls parsed from the
  model's own format into ``message.tool_calls``), as a body or, with ``stream=true``, as server-sent
  events (:mod:`agentenv.agents.openai_format`); ``tool_choice`` (``none``, ``auto``, ``required``, a
  named function: the call's opening is forced), ``logprobs`` (the behaviour log-probabilities) and
  ``n`` (each choice its own sample) are honoured, as is ``top_logprobs``. The session is the API key:
  an agent is given ``api_key=SESSION_ID``
  (``OPENAI_API_KEY``), so an unmodified ``openai`` client program works.
* ``POST /v1/responses``: the Responses API, translated to the same session
  (:mod:`agentenv.agents.responses_api`), as a ``response`` object or its typed event stream.

Bad input is an OpenAI-style error body ``{"error": {"message", "type", "param", "code"}}`` and the
server keeps serving: an unknown model (404 ``model_not_found``), no API key (401 ``missing_api_key``),
a session that does not exist (404 ``session_not_found``) or has ended (409 ``session_closed``), a
malformed body, messages, tools or ``tool_choice`` (400), a ``max_tokens`` beyond the episode's budget
(400 ``max_tokens_exceeded``), ``n`` outside 1-8 or ``top_logprobs`` outside 0-20 or without ``logprobs``
(400).
A request is refused before anything is streamed, so an error is always a status and an error body.
The endpoint binds loopback only: the agents are this process's episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from agentenv.agents import responses_api
from agentenv.agents.session import AgentSession, OpenAIError
from agentenv.engines.base import GenerationEngine
from agentenv.rollout.episode import RolloutConfig

if TYPE_CHECKING:
    from agentenv.rollout.chat import ChatRenderer
    from agentenv.rollout.tool_calls import ToolCallParser

logger = logging.getLogger(__name__)

#: The model name an agent asks for when nothing else is configured.
DEFAULT_MODEL = "agentenv-policy"
#: Largest request body accepted (bytes).
MAX_BODY_BYTES = 16 * 1024 * 1024


class AgentEndpoint:
    """The endpoint of one engine and renderer: sessions, the Starlette app and its uvicorn server.

    Args:
        engine: The generation engine (the collector's, so weight updates reach agent requests too).
        renderer: The policy's chat renderer.
        models: Model names an agent may ask for (the first is the one ``/v1/models`` lists first);
            any other name is refused with ``model_not_found``.

    Use ``await endpoint.start()``, :meth:`open_session` per episode, :meth:`close_session` when it
    ends, ``await endpoint.close()``.
    """

    def __init__(self, engine: GenerationEngine, renderer: ChatRenderer, *,
                 models: Sequence[str] = (DEFAULT_MODEL,)) -> None:
        if not models:
            raise ValueError("AgentEndpoint needs at least one model name")
        self.engine, self.renderer, self.models = engine, renderer, tuple(models)
        self.sessions: dict[str, AgentSession] = {}
        self.ended: set[str] = set()  # ids of closed sessions (409 rather than 404)
        self.errors = 0  #: requests refused with an error body
        self._server: Any = None
        self._task: asyncio.Task | None = None
        self.port: int | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` (after :meth:`start`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- sessions -------------------------------------------------------------------------------
    def open_session(self, cfg: RolloutConfig, parser: ToolCallParser,
                     version_fn: Callable[[], int] | None = None) -> AgentSession:
        """A new session (one episode): its id is the API key the agent sends."""
        sid = f"sess-{uuid.uuid4().hex}"
        session = AgentSession(sid, self.engine, self.renderer, cfg, parser,
                               version_fn or (lambda: self.engine.version))
        self.sessions[sid] = session
        return session

    def close_session(self, session_id: str) -> AgentSession:
        """End a session: later requests with its key get ``session_closed`` (409)."""
        session = self.sessions.pop(session_id)
        session.closed = True
        self.ended.add(session_id)
        return session

    # -- HTTP -----------------------------------------------------------------------------------
    def app(self) -> Any:
        """The Starlette application."""
        from starlette.applications import Starlette
        from starlette.exceptions import HTTPException
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response, StreamingResponse
        from starlette.routing import Route

        def error(exc: OpenAIError) -> JSONResponse:
            self.errors += 1
            return JSONResponse(exc.body(), status_code=exc.status)

        def model_card(name: str) -> dict[str, Any]:
            return {"id": name, "object": "model", "created": 0, "owned_by": "agentenv"}

        async def models(request: Request) -> JSONResponse:
            return JSONResponse({"object": "list", "data": [model_card(m) for m in self.models]})

        async def model(request: Request) -> JSONResponse:
            name = request.path_params["model"]
            if name not in self.models:
                return error(_unknown_model(name, self.models))
            return JSONResponse(model_card(name))

        async def read(request: Request) -> tuple[AgentSession, dict[str, Any]]:
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                raise OpenAIError(413, f"request body over {MAX_BODY_BYTES} bytes", code="request_too_large")
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise OpenAIError(400, f"the body is not JSON: {exc}", code="invalid_json") from None
            if not isinstance(body, dict):
                raise OpenAIError(400, "the body must be a JSON object", code="invalid_json")
            session = self._session(request.headers.get("authorization", ""))
            if body.get("model") not in self.models:
                raise _unknown_model(body.get("model"), self.models)
            return session, body

        def served(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
            async def run(request: Request) -> Response:
                try:
                    return await handler(request)
                except OpenAIError as exc:
                    return error(exc)
                except Exception as exc:  # never let one request take the server down
                    logger.exception("agent endpoint: request failed")
                    return error(OpenAIError(500, f"{type(exc).__name__}: {exc}", code="internal_error",
                                             type_="server_error"))
            return run

        def events(lines: list[str]) -> StreamingResponse:
            return StreamingResponse(iter(lines), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        @served
        async def completions(request: Request) -> Response:
            session, body = await read(request)
            reply = await session.complete(body, body["model"])
            return events(reply.events()) if reply.stream else JSONResponse(reply.body())

        @served
        async def responses(request: Request) -> Response:
            session, body = await read(request)
            reply = await session.complete(responses_api.chat_request(body), body["model"])
            if reply.stream:
                return events(responses_api.response_events(reply, body))
            return JSONResponse(responses_api.response_object(reply, body))

        async def not_found(request: Request, exc: HTTPException) -> JSONResponse:
            code = "not_found" if exc.status_code == 404 else "method_not_allowed"
            return error(OpenAIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}",
                                     code=code))

        routes = [Route("/v1/models", models), Route("/v1/models/{model:path}", model),
                  Route("/v1/chat/completions", completions, methods=["POST"]),
                  Route("/v1/responses", responses, methods=["POST"])]
        return Starlette(routes=routes, exception_handlers={HTTPException: not_found})

    def _session(self, authorization: str) -> AgentSession:
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise OpenAIError(401, "no session key: pass the episode's session id as the API key "
                              "(Authorization: Bearer SESSION_ID)", code="missing_api_key",
                              type_="authentication_error")
        key = key.strip()
        session = self.sessions.get(key)
        if session is None:
            if key in self.ended:
                raise OpenAIError(409, f"session {key} has ended (its episode is over)", code="session_closed")
            raise OpenAIError(404, f"no session {key!r} (each episode's agent gets its own key)",
                              code="session_not_found")
        return session

    async def start(self) -> str:
        """Serve on a free loopback port in this event loop; return :attr:`base_url`."""
        import uvicorn

        if self._task is not None:
            return self.base_url
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
            await asyncio.sleep(0.005)
        return self.base_url

    async def close(self) -> None:
        """Stop serving (open sessions are closed). Safe to call twice."""
        for sid in list(self.sessions):
            self.close_session(sid)
        if self._task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._task, 10)
        self._task = None


def _unknown_model(name: Any, models: Sequence[str]) -> OpenAIError:
    return OpenAIError(404, f"the model {name!r} does not exist; this endpoint serves: {', '.join(models)}",
                       code="model_not_found", param="model")
