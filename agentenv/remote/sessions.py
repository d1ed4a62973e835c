"""The server's sessions: one environment episode each, created by reset, played by steps.

A :class:`SessionTable` owns every environment instance of one ``agentenv serve`` process. It hands
a session an idle environment (or builds one, in a thread), resets it, and plays its steps one at a
time; a session whose episode ended stays until it is closed or expires. Calls are idempotent (see
:mod:`agentenv.remote.protocol`): a repeated ``request_id`` returns the session it created, a
repeated step index returns the stored answer.

An environment that raises, or does not answer within ``call_timeout_s``, fails only its session
(closed, never reused); the other sessions go on.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentenv.core import Env
from agentenv.remote.protocol import jsonable

logger = logging.getLogger(__name__)


class SessionError(Exception):
    """A call the table refuses; ``kind`` is a :data:`~agentenv.remote.protocol.ERROR_STATUS` key."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Session:
    """One episode on one environment instance.

    Attributes:
        id: Random URL-safe id (16 bytes of entropy).
        env: The environment playing the episode.
        request_id: The ``request_id`` of the reset that created it.
        first: The reset's answer (returned again to a repeated reset).
        steps: Steps played so far.
        last: The answer of the last step (returned again to a repeated step index), or None.
        over: The episode terminated or was truncated; further steps are refused.
        touched: ``time.monotonic()`` of the last call (seconds), for expiry.
    """

    id: str
    env: Env
    request_id: str
    first: dict[str, Any]
    steps: int = 0
    last: dict[str, Any] | None = None
    over: bool = False
    touched: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class SessionTable:
    """Every session of a server, with a small stock of idle environments to reuse.

    Args:
        factory: Builds one environment (``make(env_id, **env_kwargs)``); called in a worker thread.
        max_sessions: Most sessions open at once; one more is refused with kind ``"capacity"``.
        idle_envs: Most environments kept for reuse after their session closed (the rest are closed).
        call_timeout_s: Seconds a ``reset`` or ``step`` of the environment may take; past it the
            session fails with kind ``"env_timeout"``.
        session_idle_s: Seconds without a call after which a session is closed by :meth:`expire`.
    """

    def __init__(self, factory: Callable[[], Env], *, max_sessions: int, idle_envs: int,
                 call_timeout_s: float, session_idle_s: float) -> None:
        self._factory = factory
        self.max_sessions = max_sessions
        self.idle_envs = idle_envs
        self.call_timeout_s = call_timeout_s
        self.session_idle_s = session_idle_s
        self._sessions: dict[str, Session] = {}
        self._by_request: dict[str, asyncio.Future[Session]] = {}
        self._idle: list[Env] = []
        self.created = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._sessions)

    def add_idle(self, env: Env) -> None:
        """Keep ``env`` (fresh, or from a closed session) for the next session."""
        self._idle.append(env)

    async def create(self, request_id: str, seed: int | None, options: Mapping[str, Any] | None) -> Session:
        """Reset an environment into a new session, or return the session ``request_id`` already made.

        Raises:
            SessionError: ``"capacity"`` (``max_sessions`` open), ``"env_error"`` (building or
                resetting the environment raised), ``"env_timeout"`` (the reset took longer than
                ``call_timeout_s``).
        """
        pending = self._by_request.get(request_id)
        if pending is not None:  # a retry: wait for (or return) the first attempt's session
            session = await asyncio.shield(pending)
            session.touched = time.monotonic()
            return session
        if len(self._sessions) + sum(not f.done() for f in self._by_request.values()) >= self.max_sessions:
            raise SessionError("capacity", f"the server holds {self.max_sessions} sessions (max_sessions)")
        future: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)  # never "unretrieved"
        self._by_request[request_id] = future
        try:
            session = await self._reset(request_id, seed, options)
        except BaseException as exc:
            del self._by_request[request_id]
            future.set_exception(exc if isinstance(exc, SessionError) else SessionError("internal", str(exc)))
            raise
        future.set_result(session)
        return session

    async def _reset(self, request_id: str, seed: int | None, options: Mapping[str, Any] | None) -> Session:
        try:
            env = self._idle.pop() if self._idle else await asyncio.to_thread(self._factory)
        except Exception as exc:
            raise SessionError("env_error", f"building the environment raised {type(exc).__name__}: {exc}") from exc
        try:
            obs, info = await self._call(env.reset(seed=seed, options=options), "reset")
        except BaseException:
            await self._discard(env)
            raise
        session_id = secrets.token_urlsafe(16)
        first = {"session": session_id, "observation": jsonable(obs), "info": jsonable(info),
                 "system_prompt": env.system_prompt, "tools": jsonable(list(env.tools))}
        session = Session(id=session_id, env=env, request_id=request_id, first=first)
        self._sessions[session_id] = session
        self.created += 1
        return session

    async def step(self, session_id: str, action: str, index: int) -> dict[str, Any]:
        """Play step ``index`` of a session, or return its stored answer if ``index`` is the last one played.

        Returns:
            ``{"observation", "reward", "terminated", "truncated", "info", "step"}``.

        Raises:
            SessionError: ``"unknown_session"``, ``"episode_over"`` (a new index after the episode
                ended), ``"out_of_order"`` (an index neither next nor last), ``"env_error"`` /
                ``"env_timeout"`` (the step raised or stalled; the session is closed).
        """
        session = self._get(session_id)
        async with session.lock:
            session.touched = time.monotonic()
            if session.last is not None and index == session.steps - 1:
                return session.last
            if session.over:
                raise SessionError("episode_over", f"the episode of session {session_id} has ended; "
                                   "create a new session (POST /sessions)")
            if index != session.steps:
                raise SessionError("out_of_order", f"step {index} of session {session_id}: expected "
                                   f"{session.steps} (or {session.steps - 1} to repeat the last)")
            try:
                obs, reward, terminated, truncated, info = await self._call(session.env.step(action), "step")
            except BaseException:
                self._sessions.pop(session_id, None)
                self._by_request.pop(session.request_id, None)
                await self._discard(session.env)
                raise
            session.steps += 1
            session.over = bool(terminated or truncated)
            session.last = {"observation": jsonable(obs), "reward": float(reward), "terminated": bool(terminated),
                            "truncated": bool(truncated), "info": jsonable(info), "step": index}
            session.touched = time.monotonic()
            return session.last

    async def close(self, session_id: str) -> None:
        """Close a session; its environment is kept for reuse (up to ``idle_envs``) or closed.

        Raises:
            SessionError: ``"unknown_session"``.
        """
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise SessionError("unknown_session", f"no session {session_id!r} (closed, expired or never created)")
        self._by_request.pop(session.request_id, None)
        async with session.lock:  # a step in flight finishes first
            if len(self._idle) < self.idle_envs:
                self._idle.append(session.env)
            else:
                await self._close_env(session.env)

    async def expire(self) -> int:
        """Close the sessions idle for more than ``session_idle_s``; return how many."""
        now = time.monotonic()
        stale = [s.id for s in self._sessions.values() if now - s.touched > self.session_idle_s and not s.lock.locked()]
        for session_id in stale:
            logger.info("session %s expired after %.0f s without a call", session_id, self.session_idle_s)
            await self.close(session_id)
        return len(stale)

    async def shutdown(self) -> None:
        """Close every session and idle environment."""
        envs = [s.env for s in self._sessions.values()] + self._idle
        self._sessions.clear()
        self._by_request.clear()
        self._idle = []
        for env in envs:
            await self._close_env(env)

    def _get(self, session_id: str) -> Session:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise SessionError("unknown_session",
                               f"no session {session_id!r} (closed, expired or never created)") from None

    async def _call(self, call: Any, what: str) -> Any:
        try:
            return await asyncio.wait_for(call, self.call_timeout_s)
        except TimeoutError:
            raise SessionError("env_timeout", f"the environment's {what} took more than "
                               f"{self.call_timeout_s:g} s (call_timeout_s)") from None
        except SessionError:
            raise
        except Exception as exc:
            raise SessionError("env_error", f"the environment's {what} raised {type(exc).__name__}: {exc}") from exc

    async def _discard(self, env: Env) -> None:
        self.failed += 1
        await self._close_env(env)

    async def _close_env(self, env: Env) -> None:
        try:
            await asyncio.wait_for(env.close(), 30.0)
        except Exception as exc:  # a close error must not fail the server
            logger.warning("closing an environment raised %s: %s", type(exc).__name__, exc)
