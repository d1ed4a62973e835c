"""``agentenv serve``: any registered environment as an HTTP server (Starlette on uvicorn).

One session per episode (see :mod:`agentenv.remote.protocol` for the routes and bodies). The server
binds loopback unless told otherwise; a non-loopback host needs a token, and with a token every
request needs ``Authorization: Bearer TOKEN``. Bad requests (malformed bodies, unknown sessions,
steps after the end, oversized actions, missing tokens) are typed errors to their caller; the server
goes on serving the other sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, fields, make_dataclass
from typing import Annotated, Any

from agentenv.configio import key_values
from agentenv.core import Env
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.remote.protocol import ERROR_STATUS, PROTOCOL_VERSION, body_cap, dumps, error_body, jsonable
from agentenv.remote.sessions import SessionError, SessionTable

logger = logging.getLogger(__name__)

#: Environment variable read for the token when ``--token`` is not given (keeps it out of ``ps``).
TOKEN_ENV = "AGENTENV_REMOTE_TOKEN"


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeConfig:
    """One ``agentenv serve`` process: which environment, where, and its limits."""

    env_id: str
    """Registered environment id served (``agentenv envs`` lists them)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of every environment instance: ``make(env_id, **env_kwargs)``."""
    host: str = "127.0.0.1"
    """Address to bind. Anything but loopback needs ``token``."""
    port: int = 8000
    """TCP port; 0 picks a free one (the bound port is printed on the first line of stdout)."""
    token: str | None = None
    """Bearer token every request must carry; None: no token (loopback only)."""
    max_sessions: int = 1024
    """Sessions (episodes) open at once; one more is refused with kind ``capacity`` (HTTP 503)."""
    max_action_chars: int = 65_536
    """Longest action (characters) a step accepts; longer is kind ``too_large`` (HTTP 413)."""
    idle_envs: int = 64
    """Environment instances kept for reuse after their session closed."""
    call_timeout_s: float = 300.0
    """Seconds one ``reset`` or ``step`` of the environment may take (then kind ``env_timeout``)."""
    session_idle_s: float = 600.0
    """Seconds without a call after which a session is closed (a client that vanished)."""

    def __post_init__(self) -> None:
        if not is_loopback(self.host) and not self.token:
            raise ConfigError(f"host {self.host!r} is not loopback: serving it needs a token "
                              f"(--token, or ${TOKEN_ENV}); requests then carry 'Authorization: Bearer TOKEN'")
        if not 0 <= self.port <= 65_535:
            raise ConfigError(f"port must be in [0, 65535], got {self.port}")
        if self.max_sessions < 1 or self.max_action_chars < 1 or self.idle_envs < 0:
            raise ConfigError("max_sessions and max_action_chars must be >= 1, idle_envs >= 0")
        if not (self.call_timeout_s > 0 and self.session_idle_s > 0):
            raise ConfigError("call_timeout_s and session_idle_s must be > 0 seconds")


class _BadRequest(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def build_app(cfg: ServeConfig, factory: Callable[[], Env] | None = None) -> Any:
    """The Starlette application serving ``cfg.env_id``.

    One environment is built here (and kept for the first episode), so that a wrong id or
    constructor argument fails before the server listens.

    Args:
        cfg: The server's settings.
        factory: Builds one environment; default ``make(cfg.env_id, **cfg.env_kwargs)``.

    Raises:
        EnvNotFound / RegistrationError / ConfigError: From building the first environment.
    """
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    if factory is None:
        from agentenv.registration import make

        def factory() -> Env:
            return make(cfg.env_id, **cfg.env_kwargs)

    first = factory()
    env_cls = type(first)
    table = SessionTable(factory, max_sessions=cfg.max_sessions, idle_envs=cfg.idle_envs,
                         call_timeout_s=cfg.call_timeout_s, session_idle_s=cfg.session_idle_s)
    table.add_idle(first)
    tasks = first.tasks()
    tasks_body = {"tasks": None if tasks is None else {"ids": list(tasks.ids), "kinds": list(tasks.kinds)},
                  "split": str(first.split)}
    info_body = {"protocol": PROTOCOL_VERSION, "env": cfg.env_id,
                 "observation_role": env_cls.observation_role,
                 "cut_turn": first.cut_turn, "system_prompt": first.system_prompt,
                 "tools": jsonable(list(first.tools)), "max_action_chars": cfg.max_action_chars,
                 "timing_info_keys": list(first.timing_info_keys)}
    cap = body_cap(cfg.max_action_chars)
    expected = f"Bearer {cfg.token}".encode() if cfg.token else None

    def answer(body: Any, status: int = 200) -> Response:
        return Response(dumps(body), status_code=status, media_type="application/json")

    def error(kind: str, message: str) -> Response:
        return answer(error_body(kind, message), ERROR_STATUS[kind])

    async def read_json(request: Request) -> dict[str, Any]:
        too_large = f"request body over {cap} bytes (max_action_chars={cfg.max_action_chars})"
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > cap):
            raise _BadRequest("too_large", too_large)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > cap:
                raise _BadRequest("too_large", too_large)
            chunks.append(chunk)
        try:
            body = json.loads(b"".join(chunks) or b"{}")
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _BadRequest("bad_request", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise _BadRequest("bad_request", f"the body must be a JSON object, got {type(body).__name__}")
        return body

    def endpoint(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            if expected is not None:
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    return error("unauthorized", "this server needs 'Authorization: Bearer TOKEN'")
            try:
                return await handler(request)
            except (_BadRequest, SessionError) as exc:
                return error(exc.kind, str(exc))
            except Exception as exc:  # a bug must not take the server down
                logger.exception("internal error on %s %s", request.method, request.url.path)
                return error("internal", f"{type(exc).__name__}: {exc}")

        return run

    @endpoint
    async def health(request: Request) -> Response:
        return answer({"status": "ok", "env": cfg.env_id, "sessions": len(table), "protocol": PROTOCOL_VERSION})

    @endpoint
    async def info(request: Request) -> Response:
        return answer(info_body)

    @endpoint
    async def list_tasks(request: Request) -> Response:
        return answer(tasks_body)

    @endpoint
    async def create(request: Request) -> Response:
        body = await read_json(request)
        request_id, seed, options = body.get("request_id"), body.get("seed"), body.get("options")
        if not isinstance(request_id, str) or not 0 < len(request_id) <= 128:
            raise _BadRequest("bad_request", "'request_id' must be a string of 1 to 128 characters")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise _BadRequest("bad_request", f"'seed' must be an integer or null, got {seed!r:.40}")
        if options is not None and not isinstance(options, dict):
            raise _BadRequest("bad_request", "'options' must be a JSON object or null")
        session = await table.create(request_id, seed, options)
        return answer(session.first, 201)

    @endpoint
    async def step(request: Request) -> Response:
        body = await read_json(request)
        action, index = body.get("action"), body.get("step")
        if not isinstance(action, str):
            raise _BadRequest("bad_request", "'action' must be a string")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise _BadRequest("bad_request", "'step' must be an integer >= 0 (the step's index in the episode)")
        if len(action) > cfg.max_action_chars:
            raise _BadRequest("too_large", f"action of {len(action)} characters; the cap is "
                              f"{cfg.max_action_chars} (max_action_chars)")
        return answer(await table.step(request.path_params["session_id"], action, index))

    @endpoint
    async def close(request: Request) -> Response:
        await table.close(request.path_params["session_id"])
        return answer({"closed": True})

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        kind = {404: "not_found", 405: "method_not_allowed"}.get(status, "bad_request" if status < 500 else "internal")
        return error(kind, f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}")

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async def reap() -> None:
            while True:
                await asyncio.sleep(min(30.0, cfg.session_idle_s / 4))
                await table.expire()

        reaper = asyncio.create_task(reap())
        try:
            yield
        finally:
            reaper.cancel()
            await table.shutdown()

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/tasks", list_tasks, methods=["GET"]),
        Route("/sessions", create, methods=["POST"]),
        Route("/sessions/{session_id}/step", step, methods=["POST"]),
        Route("/sessions/{session_id}", close, methods=["DELETE"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.sessions = table
    return app


def serve(cfg: ServeConfig, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve ``cfg.env_id`` until interrupted (SIGINT/SIGTERM close every session first).

    Args:
        cfg: The server's settings.
        ready: Called with the base URL (``http://host:port``, the bound port) once the socket is bound.

    Raises:
        EnvNotFound / RegistrationError / ConfigError: The environment cannot be built.
        OSError: The address cannot be bound.
    """
    import uvicorn

    app = build_app(cfg)
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((cfg.host, cfg.port))
    sock.listen(2048)  # connections made once ``ready`` ran wait in the backlog until uvicorn accepts
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if family == socket.AF_INET6 else f"http://{host}:{port}"
    if ready is not None:
        ready(url)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_keep_alive=30,
                                           backlog=2048))
    server.run(sockets=[sock])


def _command_options() -> type[ServeConfig]:
    """:class:`ServeConfig` as ``agentenv serve`` reads it with tyro (:mod:`agentenv.cli_args`).

    Two fields read differently on the command line: the environment id is positional, and the
    constructor arguments come as repeated ``--env-arg KEY=VALUE`` (each VALUE read as YAML). A token
    not given is taken from ``$AGENTENV_REMOTE_TOKEN`` (kept out of ``ps`` and ``--help``). The values
    are not checked here: :func:`main` builds the :class:`ServeConfig` from them, which checks them.
    """
    import tyro

    def token_from_environment(self: ServeConfig) -> None:  # the values are checked by ServeConfig (main)
        if self.token is None:
            object.__setattr__(self, "token", os.environ.get(TOKEN_ENV) or None)

    key_value_items = tyro.constructors.PrimitiveConstructorSpec(
        nargs=1, metavar="KEY=VALUE", _action="append", is_instance=lambda x: isinstance(x, dict),
        instance_from_str=lambda items: key_values(items, "--env-arg"),
        str_from_instance=lambda kwargs: [f"{k}={json.dumps(v)}" for k, v in kwargs.items()])
    env_id = Annotated[str, tyro.conf.Positional, tyro.conf.arg(
        metavar="ENV_ID", help="registered environment id served (`agentenv envs` lists them)")]
    env_kwargs = Annotated[dict[str, Any], key_value_items, tyro.conf.arg(
        name="env-arg", help="a constructor argument of every environment instance (VALUE read as YAML); "
        "repeat for more")]
    token = Annotated[str | None, tyro.conf.arg(
        help=f"bearer token every request must carry (default ${TOKEN_ENV}; none: loopback only)")]
    read_differently = [("env_id", env_id), ("env_kwargs", env_kwargs, field(default_factory=dict)),
                        ("token", token, None)]
    return make_dataclass("ServeOptions", read_differently, bases=(ServeConfig,), frozen=True,
                          namespace={"__post_init__": token_from_environment})


def main(argv: Sequence[str] | None = None) -> int:
    """``agentenv serve ENV_ID [--host H] [--port N] [--env-arg K=V ...] [--token T] [...]``; the exit status.

    The options are :class:`ServeConfig`'s fields (``--max-sessions``, ``--call-timeout-s``, ...).
    Prints ``agentenv serve: ENV_ID on URL`` on stdout once bound; errors (a value out of range
    included) go to stderr with status 1, a flag or value that does not parse with status 2. Ctrl-C
    (SIGINT) closes the sessions and stops with status 130 and one line, SIGTERM with status 0.
    """
    from agentenv.cli_args import parse

    try:
        options = parse(_command_options(), sys.argv[1:] if argv is None else argv, prog="agentenv serve",
                        description="Serve a registered environment over HTTP (one session per episode).")
        if isinstance(options, int):
            return options
        cfg = ServeConfig(**{f.name: getattr(options, f.name) for f in fields(ServeConfig)})
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        serve(cfg, ready=lambda url: print(f"agentenv serve: {cfg.env_id} on {url}", flush=True))
    except (AgentEnvError, OSError) as exc:
        print(f"agentenv serve: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # uvicorn has closed every session, then passes Ctrl-C on
        print("agentenv serve: stopped", file=sys.stderr)
        return 130
    return 0
