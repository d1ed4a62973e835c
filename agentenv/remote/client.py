"""``RemoteEnv``: an environment served by ``agentenv serve``, played over HTTP with ``httpx``.

``agentenv.make(ENV_ID, remote="http://host:port")`` (or ``env.remote`` in a recipe) returns one.
Each episode is one server session; with a list of servers, episodes are spread round-robin over
them. Every call has a timeout and is idempotent (see :mod:`agentenv.remote.protocol`), so calls
are retried after a lost answer, a dropped connection or a full server. A server that dies, stalls
or answers garbage makes the call raise :class:`~agentenv.errors.RemoteEnvError` within
``(retries + 1) * (timeout_s + connect_timeout_s)`` seconds plus the back-off: that episode fails
as an infrastructure failure (the collector replays it; it never scores 0), and the process never hangs.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import ssl
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from agentenv.core import Env, StepResult, TaskSet
from agentenv.errors import ConfigError, RemoteEnvError, ResetNeeded
from agentenv.remote.protocol import PROTOCOL_VERSION, RETRYABLE_KINDS

logger = logging.getLogger(__name__)

#: Environment variable read for the token when none is given (the server reads the same one).
TOKEN_ENV = "AGENTENV_REMOTE_TOKEN"

_descriptions: dict[tuple[tuple[str, ...], str | None], dict[str, Any]] = {}
_tasks: dict[tuple[tuple[str, ...], str | None], dict[str, Any]] = {}
_turns: dict[tuple[str, ...], itertools.count] = {}


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client: httpx builds a new one per client otherwise (about 60 ms each)."""
    return httpx.create_ssl_context()


def server_urls(remote: str | Sequence[str]) -> tuple[str, ...]:
    """``remote`` (one URL or a list) as a tuple of base URLs without a trailing slash.

    Raises:
        ConfigError: An empty list, or a URL that is not ``http://`` or ``https://``.
    """
    urls = (remote,) if isinstance(remote, str) else tuple(remote)
    if not urls:
        raise ConfigError("remote: give at least one server URL (http://host:port)")
    for url in urls:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"remote: {url!r} is not an http:// or https:// URL")
    return tuple(u.rstrip("/") for u in urls)


class RemoteEnv(Env[Any, str]):
    """An environment played on ``agentenv serve`` servers; the same contract as the one it serves.

    Built synchronously: the first instance for a list of servers reads their ``/info`` once (roles,
    tools, limits; cached per process), so a wrong URL or id fails here, not inside an episode.

    Randomness: ``reset(seed=s)`` seeds this client's generator and plays seed ``s``; an unseeded
    reset draws the server's seed from this generator, so episodes are reproducible from the client.

    Args:
        env_id: The environment id the servers must serve.
        remote: One server URL (``http://host:port``) or a list, balanced across episodes.
        token: Bearer token of the servers; default ``$AGENTENV_REMOTE_TOKEN`` (None: no header).
        timeout_s: Seconds one call may take, transfer included (a step of a slow environment too).
        connect_timeout_s: Seconds to open a connection.
        retries: Further attempts of a call after a transport error, a timeout or a full server
            (kind ``capacity``); a reset tries the next server each time.

    Raises:
        ConfigError: A bad URL, or a server serving another environment id or protocol version.
        RemoteEnvError: No server answered ``/info`` (kind ``unreachable`` / ``timeout`` /
            ``protocol``, or the server's own error kind, e.g. ``unauthorized``).
    """

    def __init__(self, env_id: str, remote: str | Sequence[str], *, token: str | None = None,
                 timeout_s: float = 60.0, connect_timeout_s: float = 5.0, retries: int = 2) -> None:
        if not (timeout_s > 0 and connect_timeout_s > 0) or retries < 0:
            raise ConfigError("RemoteEnv: timeout_s and connect_timeout_s must be > 0, retries >= 0")
        self.env_id = env_id
        self.urls = server_urls(remote)
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.timeout_s, self.connect_timeout_s, self.retries = timeout_s, connect_timeout_s, retries
        self._headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        desc = self._describe()
        self.observation_role = desc["observation_role"]  # type: ignore[misc] (the served env's class value)
        self.cut_turn = desc["cut_turn"]  # type: ignore[misc]
        self.system_prompt = desc["system_prompt"]
        self.tools = tuple(desc["tools"])
        self.max_action_chars = int(desc["max_action_chars"])
        #: ``info`` keys holding wall-clock timings (the served env's; a server that predates them says none)
        self.timing_info_keys = tuple(desc.get("timing_info_keys", ()))
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._url: str | None = None
        self._session: str | None = None
        self._steps = 0
        # sessions this client may have left open on a server (a reset or a close cut short by a
        # cancellation or a lost answer); closed by the next reset() or close() (_close_leftovers)
        self._unclosed: dict[str, str] = {}  # session id -> server URL: DELETE sent, no answer read
        self._unanswered: list[tuple[dict[str, Any], list[str]]] = []  # (reset body, servers it may have reached)
        self._over = False

    # -- the Env contract ---------------------------------------------------------------------------
    async def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
                    ) -> tuple[Any, dict[str, Any]]:
        """Close the previous episode (if any) and start one on the next server.

        Raises:
            RemoteEnvError: No server started the episode (see the class docstring for the kinds;
                ``env_error`` when the environment's reset raised on the server).
        """
        await super().reset(seed=seed)
        await self._end_session()
        await self._close_leftovers()
        play_seed = seed if seed is not None else int(self.np_random.integers(2**31 - 1))
        turn = _turns.setdefault(self.urls, itertools.count())
        start = next(turn) % len(self.urls)
        order = [self.urls[(start + i) % len(self.urls)] for i in range(len(self.urls))]
        body = {"request_id": uuid.uuid4().hex, "seed": play_seed, "options": dict(options or {})}
        maybe: list[str] = []  # servers that may hold this reset's session, its answer unread
        self._unanswered.append((body, maybe))
        data, url = await self._call("POST", "/sessions", body, order, unanswered=maybe)
        if not maybe:
            self._unanswered.remove((body, maybe))
        _expect(data, {"session": str, "info": dict, "tools": list}, url)
        self._url, self._session, self._steps, self._over = url, data["session"], 0, False
        self.system_prompt = data.get("system_prompt")
        self.tools = tuple(data["tools"])
        return data.get("observation"), data["info"]

    async def step(self, action: str) -> StepResult[Any]:
        """Play one step of the current episode.

        Raises:
            ResetNeeded: No episode is running (before ``reset``, after it ended, or after a step
                that raised RemoteEnvError).
            RemoteEnvError: The step failed (kinds as in the class docstring; ``too_large`` for an
                action over the server's ``max_action_chars``; ``unknown_session`` when the server
                lost the session, e.g. it restarted or the session expired).
        """
        if self._session is None or self._over:
            raise ResetNeeded("call reset() first" if self._session is None else "the episode has ended; reset()")
        if not isinstance(action, str):
            raise TypeError(f"a remote action is a string, got {type(action).__name__}")
        if len(action) > self.max_action_chars:
            raise RemoteEnvError(f"action of {len(action)} characters; the server caps actions at "
                                 f"{self.max_action_chars} (max_action_chars)", kind="too_large")
        body = {"action": action, "step": self._steps}
        try:
            data, url = await self._call("POST", f"/sessions/{self._session}/step", body, [self._url or ""])
        except RemoteEnvError as exc:
            if exc.kind == "episode_over":
                self._over = True
                raise ResetNeeded(str(exc)) from exc
            self._over = True  # a failed step ends the episode; reset() starts the next one
            if exc.kind in ("env_error", "env_timeout", "unknown_session"):
                self._session = None  # the server has closed it
            raise
        _expect(data, {"reward": (int, float), "terminated": bool, "truncated": bool, "info": dict, "step": int}, url)
        if data["step"] != self._steps:
            raise RemoteEnvError(f"{url} answered step {data['step']} to step {self._steps}", kind="protocol")
        self._steps += 1
        self._over = data["terminated"] or data["truncated"]
        return StepResult(data.get("observation"), float(data["reward"]), data["terminated"], data["truncated"],
                          data["info"])

    def tasks(self) -> TaskSet | None:
        """The served environment's tasks (read once from ``/tasks``, then cached per process).

        Raises:
            RemoteEnvError: No server answered ``/tasks``.
        """
        key = (self.urls, self.token)
        if key not in _tasks:
            _tasks[key] = self._get_sync("/tasks")
        tasks = _tasks[key].get("tasks")
        if tasks is None:
            return None
        return TaskSet(tuple(tasks["ids"]), tuple(tasks["kinds"]))

    @property
    def split(self) -> str:
        """The served environment's ``split`` attribute (``""`` when it has none)."""
        key = (self.urls, self.token)
        if key not in _tasks:
            _tasks[key] = self._get_sync("/tasks")
        return str(_tasks[key].get("split", ""))

    async def close(self) -> None:
        """Close the open session (best effort: a dead server is logged, not raised) and the connections."""
        try:
            await self._end_session()
            await self._close_leftovers()
        finally:
            if self._client is not None and self._loop is _running_loop():
                await self._client.aclose()
            self._client = None
            await super().close()

    def __repr__(self) -> str:
        return f"<RemoteEnv {self.env_id} at {', '.join(self.urls)}>"

    # -- transport ---------------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        loop = _running_loop()
        if self._client is None or self._loop is not loop:  # a client belongs to the loop that made it
            self._client = httpx.AsyncClient(headers=self._headers, verify=_tls(), timeout=httpx.Timeout(
                self.timeout_s, connect=self.connect_timeout_s))
            self._loop = loop
        return self._client

    async def _call(self, method: str, path: str, body: dict[str, Any] | None, bases: Sequence[str], *,
                    unanswered: list[str] | None = None, retries: int | None = None) -> tuple[dict[str, Any], str]:
        """One idempotent call, attempt ``i`` sent to ``bases[i % len(bases)]``; returns ``(answer, url)``.

        ``unanswered``, if given, holds the servers an attempt went to whose answer was never read (a
        timeout, a dropped connection, a cancellation while waiting): they may have acted on it.
        """
        client = self._http()
        last: RemoteEnvError | None = None
        for attempt in range(self.retries + 1 if retries is None else retries + 1):
            base = bases[attempt % len(bases)]
            if unanswered is not None and base not in unanswered:
                unanswered.append(base)
            try:
                response = await asyncio.wait_for(client.request(method, base + path, json=body),
                                                  self.timeout_s + self.connect_timeout_s)
                if unanswered is not None:
                    unanswered.remove(base)  # it answered: it holds the session iff that answer says so
            except (TimeoutError, httpx.TimeoutException) as exc:
                last = RemoteEnvError(f"{method} {base}{path}: no answer within {self.timeout_s:g} s "
                                      f"({type(exc).__name__})", kind="timeout")
            except httpx.TransportError as exc:
                last = RemoteEnvError(f"{method} {base}{path}: {type(exc).__name__}: {exc}", kind="unreachable")
            else:
                data = _answer(response, f"{method} {base}{path}")
                if response.is_success:
                    return data, base
                last = _typed_error(response, data, f"{method} {base}{path}")
                if last.kind not in RETRYABLE_KINDS:
                    raise last
            if attempt < self.retries:
                await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
        assert last is not None
        raise last

    async def _end_session(self) -> None:
        session, url, self._session = self._session, self._url, None
        if session is not None and url is not None:
            self._unclosed[session] = url  # until an answer is read (a cancellation leaves it for later)
            await self._delete(session, url)

    async def _delete(self, session: str, url: str) -> None:
        """DELETE one session, best effort: a server that fails to answer expires it anyway."""
        try:
            response = await asyncio.wait_for(self._http().delete(f"{url}/sessions/{session}"),
                                              self.connect_timeout_s + 5.0)
            if response.status_code not in (200, 404):
                logger.warning("closing session %s at %s: HTTP %d", session, url, response.status_code)
        except (TimeoutError, httpx.HTTPError) as exc:
            logger.info("closing session %s at %s failed (%s); the server will expire it", session, url, exc)
        self._unclosed.pop(session, None)

    async def _close_leftovers(self) -> None:
        """Close the sessions a cut-short reset or close may have left open; one attempt each.

        A reset whose answer was never read is sent again with the same ``request_id`` to each server
        it may have reached: an idempotent repeat returns the session it made (waiting for a reset
        still running), which is then deleted; a server that never saw it makes one and it is deleted.
        """
        unclosed, self._unclosed = self._unclosed, {}
        unanswered, self._unanswered = self._unanswered, []
        for session, url in unclosed.items():
            await self._delete(session, url)
        for body, bases in unanswered:
            for base in bases:
                try:  # bounded like a DELETE, not like a reset: this is clean-up
                    data, _ = await asyncio.wait_for(self._call("POST", "/sessions", body, [base], retries=0),
                                                     self.connect_timeout_s + 5.0)
                except (TimeoutError, RemoteEnvError) as exc:
                    logger.info("closing a cut-short reset at %s failed (%s); the server will expire it", base, exc)
                    continue
                if isinstance(data.get("session"), str):
                    await self._delete(data["session"], base)

    def _describe(self) -> dict[str, Any]:
        desc = describe_servers(self.urls, token=self.token, timeout_s=self.timeout_s,
                                connect_timeout_s=self.connect_timeout_s)
        if desc["env"] != self.env_id:
            raise ConfigError(f"{', '.join(self.urls)} serves {desc['env']!r}, not {self.env_id!r}")
        return desc

    def _get_sync(self, path: str) -> dict[str, Any]:
        """GET ``path`` from the first server that answers (a blocking call, made once per process)."""
        return _get_first(self.urls, path, self._headers, httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s))


def describe_servers(remote: str | Sequence[str], *, token: str | None = None, timeout_s: float = 60.0,
                     connect_timeout_s: float = 5.0) -> dict[str, Any]:
    """What the servers say of the environment they serve: ``GET /info`` of the first that answers.

    Read once per process for a list of servers and a token. The description holds ``env`` (the served
    id), ``protocol``, ``observation_role``, ``cut_turn``, ``tools``, ``system_prompt`` and
    ``max_action_chars``; a client needs nothing else to play the environment
    (``agentenv eval --remote URL`` takes the id from it).

    Args:
        remote: One server URL or a list.
        token: Bearer token of the servers; default ``$AGENTENV_REMOTE_TOKEN`` (None: no header).
        timeout_s: Seconds the call may take.
        connect_timeout_s: Seconds to open a connection.

    Raises:
        ConfigError: A bad URL, or a server speaking another protocol version.
        RemoteEnvError: No server answered (kind ``unreachable`` / ``timeout``, or the server's own
            kind, e.g. ``unauthorized``), or the answer lacks a field or has one of the wrong type
            (kind ``protocol``).
    """
    urls = server_urls(remote)
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None
    key = (urls, token)
    if key not in _descriptions:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        desc = _get_first(urls, "/info", headers, httpx.Timeout(timeout_s, connect=connect_timeout_s))
        _expect(desc, {"protocol": int, "env": str, "observation_role": str, "cut_turn": str, "tools": list,
                       "max_action_chars": int}, urls[0])
        if desc["protocol"] != PROTOCOL_VERSION:
            raise ConfigError(f"{', '.join(urls)}: protocol {desc['protocol']}, this client speaks {PROTOCOL_VERSION}")
        _descriptions[key] = desc
    return _descriptions[key]


def _get_first(urls: Sequence[str], path: str, headers: Mapping[str, str], timeout: httpx.Timeout) -> dict[str, Any]:
    """GET ``path`` from the first of ``urls`` that answers (blocking).

    Raises:
        RemoteEnvError: None answered (the last one's kind: ``timeout``, ``unreachable``, or its own).
    """
    last: RemoteEnvError | None = None
    with httpx.Client(headers=dict(headers), timeout=timeout, verify=_tls()) as client:
        for url in urls:
            try:
                response = client.get(url + path)
            except httpx.TimeoutException as exc:
                last = RemoteEnvError(f"GET {url}{path}: no answer ({type(exc).__name__})", kind="timeout")
                continue
            except httpx.TransportError as exc:
                last = RemoteEnvError(f"GET {url}{path}: {type(exc).__name__}: {exc}", kind="unreachable")
                continue
            data = _answer(response, f"GET {url}{path}")
            if response.is_success:
                return data
            last = _typed_error(response, data, f"GET {url}{path}")
    assert last is not None
    raise last


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _answer(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON object of ``response``, or a ``protocol`` RemoteEnvError when it is not one."""
    try:
        data = response.json()
    except ValueError:
        raise RemoteEnvError(f"{what}: HTTP {response.status_code} with a body that is not JSON: "
                             f"{response.text[:80]!r}", kind="protocol", status=response.status_code) from None
    if not isinstance(data, dict):
        raise RemoteEnvError(f"{what}: the answer is not a JSON object", kind="protocol", status=response.status_code)
    return data


def _typed_error(response: httpx.Response, data: dict[str, Any], what: str) -> RemoteEnvError:
    err = data.get("error")
    if not isinstance(err, dict) or not isinstance(err.get("kind"), str):
        return RemoteEnvError(f"{what}: HTTP {response.status_code} without a typed error", kind="protocol",
                              status=response.status_code)
    return RemoteEnvError(f"{what}: {err['kind']}: {err.get('message', '')}", kind=err["kind"],
                          status=response.status_code)


def _expect(data: dict[str, Any], fields: Mapping[str, type | tuple[type, ...]], url: str) -> None:
    for name, tp in fields.items():
        value = data.get(name)
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise RemoteEnvError(f"{url}: the answer's {name!r} is {value!r:.40}, not the protocol's", kind="protocol")
