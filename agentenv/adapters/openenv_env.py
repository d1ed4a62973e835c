"""``openenv/<NAME>``: an OpenEnv environment server (PyPI ``openenv-core``), played over its WebSocket protocol.

An OpenEnv server serves one environment (``create_app(Environment, Action, Observation)``, usually in
a container or a Space of its own). A client holds a session on ``ws://HOST:PORT/ws`` and sends
``{"type": "reset", "data": {"seed": s}}``, ``{"type": "step", "data": ACTION}`` and ``{"type":
"close"}``; each reset and step is answered by ``{"type": "observation", "data": {"observation": {...},
"reward": r or null, "done": bool}}`` or ``{"type": "error", "data": {"message", "code"}}``, and
``GET /schema`` gives the action's JSON schema. Nothing of OpenEnv is imported here: its server runs in
its own Python environment (openenv-core brings gradio, fastmcp and huggingface-hub), and agentenv
speaks the protocol with the ``websockets`` client:
``agentenv train --env openenv/echo env.kwargs.url=http://127.0.0.1:8000``.

The mapping onto agentenv's contract:

* **Action.** An action schema with exactly one string field besides OpenEnv's ``metadata`` (the echo
  env's ``message``, TextArena's ``message``) takes the reply as that field's value
  (``action_field`` names the field otherwise). Any other action is the reply read as one JSON object
  (the system prompt gives the schema). A reply that is not one, or that the server's schema refuses
  (``VALIDATION_ERROR``), is the policy's mistake: it is answered with an error observation, reward
  0, and the episode goes on (it counts a step), until ``max_refused`` such replies in a row cut it
  (``truncated``): a server's own limits count only the actions it takes.
* **Observation.** The observation's fields (OpenEnv leaves ``reward``, ``done`` and ``metadata`` out
  of them): one field is its text; several are their JSON (``observation_field`` picks one).
* **Reward and end.** Each step's ``reward`` (``null`` is 0); ``done`` is ``terminated``.
* **Tasks.** OpenEnv deals episodes from a reset ``seed``: the tasks are seeds ``0 .. num_tasks - 1``.

A failure outside the policy's control (the server unreachable, the connection lost, an answer that
is not the protocol, the server's environment raising, ``EXECUTION_ERROR``; no free session,
``CAPACITY_REACHED``; no answer within ``timeout_s``) raises
:class:`~agentenv.errors.RemoteEnvError`, which ends the episode as failed (the collector replays it),
never as reward 0. One env holds one session, opened at its first reset and kept across episodes;
after a failure the next reset opens a new one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agentenv.core import Env, StepResult, TaskSet, text_space
from agentenv.errors import ClosedError, ConfigError, RemoteEnvError, ResetNeeded

PREFIX = "openenv/"
RESERVED = frozenset({"metadata"})
"""Fields of every OpenEnv action that are not the policy's to fill."""
_KINDS = {"EXECUTION_ERROR": "env_error", "CAPACITY_REACHED": "capacity", "INVALID_JSON": "bad_request",
          "UNKNOWN_TYPE": "bad_request", "VALIDATION_ERROR": "bad_request"}
"""OpenEnv's error codes -> :class:`~agentenv.errors.RemoteEnvError` kinds (others: ``internal``)."""


def session_url(url: str) -> str:
    """``http(s)://HOST:PORT[/PATH]`` -> ``ws(s)://HOST:PORT[/PATH]/ws``.

    Raises:
        ConfigError: Not an http(s) or ws(s) URL with a host.
    """
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ConfigError(f"openenv: url must be http(s)://HOST:PORT, got {url!r}")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/ws", "", ""))


def action_field(schema: Mapping[str, Any]) -> str | None:
    """The field a reply fills whole: the action schema's one string property besides ``metadata``, or None."""
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k not in RESERVED}
    strings = [k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "string"]
    return strings[0] if len(props) == 1 and len(strings) == 1 else None


def observation_text(observation: Mapping[str, Any], field: str | None = None) -> str:
    """An OpenEnv observation as the policy reads it: ``field``'s value, the one field's, or all fields as JSON.

    Raises:
        RemoteEnvError: ``field`` is not among the observation's fields.
    """
    if field is not None:
        if field not in observation:
            raise RemoteEnvError(f"openenv: the observation has no field {field!r} (its fields: {sorted(observation)})",
                                 kind="protocol")
        value = observation[field]
    elif len(observation) == 1:
        (value,) = observation.values()
    else:
        return json.dumps(dict(observation), sort_keys=True)
    return value if isinstance(value, str) else json.dumps(value)


def parse_action(reply: str) -> dict[str, Any] | str:
    """The JSON object in ``reply`` (the first ``{`` to the last ``}``), or why there is none (a string)."""
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end < start:
        return "your reply must be one JSON object (the action), and it holds none"
    try:
        action = json.loads(reply[start : end + 1])
    except json.JSONDecodeError as exc:
        return f"the action is not valid JSON: {exc.msg} (column {exc.colno})"
    if not isinstance(action, dict):
        return "the action must be a JSON object"
    return action


class OpenEnvEnv(Env[str, str]):
    """An OpenEnv environment server behind agentenv's asynchronous contract (see the module docstring).

    Args:
        name: The environment's name (the id's ``<NAME>``; for listings and logs).
        url: The server, ``http://HOST:PORT`` (``ws://`` also taken).
        action_field: The action field the reply fills (default: the schema's one string field, else
            the reply is a JSON object).
        observation_field: The observation field the policy reads (default: the one field, else all
            fields as JSON).
        num_tasks: Reset seeds ``0 .. num_tasks - 1`` are the tasks.
        timeout_s: Longest wait for the server's answer to one message (seconds).
        max_refused: Replies in a row that are not a valid action before the episode is cut.

    Raises:
        ConfigError: No ``url``, a URL that is not http(s)/ws(s), ``num_tasks`` or ``max_refused`` below
            1, ``timeout_s`` not positive.
    """

    observation_space = text_space(1 << 17)
    action_space = text_space(1 << 16)
    cut_turn = "act"  # a cut reply is still played: an action the server refuses, answered as such

    def __init__(self, name: str, *, url: str | None = None, action_field: str | None = None,
                 observation_field: str | None = None, num_tasks: int = 1000, timeout_s: float = 60.0,
                 max_refused: int = 3) -> None:
        if not url:
            raise ConfigError(f"{PREFIX}{name} plays an OpenEnv server: pass its address, url=http://HOST:PORT "
                              f"(env.kwargs.url=... on the command line)")
        if num_tasks < 1:
            raise ConfigError(f"openenv: num_tasks must be >= 1, got {num_tasks}")
        if max_refused < 1:
            raise ConfigError(f"openenv: max_refused must be >= 1, got {max_refused}")
        self._max_refused, self._refused = max_refused, 0
        if not timeout_s > 0:
            raise ConfigError(f"openenv: timeout_s must be > 0, got {timeout_s}")
        self.name, self.url, self._ws_url = name, url, session_url(url)
        self._field, self._obs_field = action_field, observation_field
        self._timeout = float(timeout_s)
        self._tasks = TaskSet(tuple(f"{name}/seed-{i}" for i in range(num_tasks)), (name,) * num_tasks)
        self._schema: dict[str, Any] | None = None
        self._socket: Any = None
        self._done = True
        self._task_id = ""
        self.system_prompt: str | None = None

    def tasks(self) -> TaskSet:
        """Seeds ``0 .. num_tasks - 1`` (ids ``"<NAME>/seed-<i>"``)."""
        return self._tasks

    async def _fetch_schema(self) -> dict[str, Any]:
        import httpx

        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                answer = await client.get(self.url.rstrip("/") + "/schema")
                answer.raise_for_status()
                schema = answer.json()["action"]
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise RemoteEnvError(f"openenv {self.name}: GET {self.url}/schema failed: {type(exc).__name__}: {exc}",
                                 kind="unreachable") from exc
        if not isinstance(schema, dict):
            raise RemoteEnvError(f"openenv {self.name}: /schema's action is not a JSON schema", kind="protocol")
        props = schema.get("properties") or {}
        if self._field is None:
            self._field = action_field(schema)
        elif self._field not in props:
            raise ConfigError(f"openenv {self.name}: the action has no field {self._field!r} "
                              f"(its fields: {sorted(props)})")
        if self._field is None:
            self.system_prompt = ("Each of your replies is one action: a JSON object of this schema.\n"
                                  + json.dumps(schema, sort_keys=True))
        return schema

    async def _connect(self) -> Any:
        from websockets.asyncio.client import connect

        try:
            return await asyncio.wait_for(connect(self._ws_url, max_size=1 << 24), self._timeout)
        except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
            raise RemoteEnvError(f"openenv {self.name}: cannot open a session on {self._ws_url}: {exc!r}",
                                 kind="unreachable") from exc
        except Exception as exc:  # the handshake refused (websockets' InvalidHandshake, InvalidURI, ...)
            raise RemoteEnvError(f"openenv {self.name}: {self._ws_url} refused the session: {exc!r}",
                                 kind="unreachable") from exc

    async def _ask(self, kind: str, data: Mapping[str, Any]) -> dict[str, Any]:
        """Send one message; the answer's ``data`` (an observation) or, for a refused action, ``{"refused": msg}``."""
        if self._socket is None:
            self._socket = await self._connect()
        try:
            await self._socket.send(json.dumps({"type": kind, "data": dict(data)}))
        except Exception:  # closed: a server that refuses a session says why, then closes; read it below
            pass
        try:
            raw = await asyncio.wait_for(self._socket.recv(), self._timeout)
            answer = json.loads(raw)
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise await self._broken(f"no answer to {kind!r} within {self._timeout:g} s", "timeout") from exc
        except (json.JSONDecodeError, TypeError) as exc:
            raise await self._broken(f"the answer to {kind!r} is not JSON", "protocol") from exc
        except Exception as exc:  # the connection closed (websockets' ConnectionClosed) or broke
            raise await self._broken(f"the session broke during {kind!r}: {exc!r}", "unreachable") from exc
        if not isinstance(answer, dict) or not isinstance(answer.get("data"), dict):
            raise await self._broken(f"the answer to {kind!r} is not the protocol: {str(answer):.200}", "protocol")
        body = answer["data"]
        if answer.get("type") == "error":
            code, message = body.get("code"), body.get("message", "")
            if code == "VALIDATION_ERROR" and kind == "step":
                return {"refused": f"{message}: {json.dumps(body.get('errors', []), default=str):.500}"}
            if code in ("CAPACITY_REACHED", "SESSION_ERROR", "FACTORY_ERROR"):
                await self._drop()
            if code == "CAPACITY_REACHED":
                message += (" (the server plays at most that many episodes at once: lower run.concurrency or "
                            "eval's --concurrency to it, or start the server with more)")
            raise RemoteEnvError(f"openenv {self.name}: the server answered {kind!r} with {code}: {message}",
                                 kind=_KINDS.get(code, "internal"))
        if answer.get("type") != "observation" or not isinstance(body.get("observation"), dict):
            raise await self._broken(f"the answer to {kind!r} is not an observation: {str(answer):.200}", "protocol")
        return body

    async def _broken(self, message: str, kind: str) -> RemoteEnvError:
        """End the session (the next reset opens a new one) and return the error to raise."""
        await self._drop()
        return RemoteEnvError(f"openenv {self.name}: {message}", kind=kind)

    async def _drop(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            try:
                await socket.close()
            except Exception:  # already broken: nothing left to close
                pass

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset the server's environment with the task's seed.

        ``options={"task": i}`` plays seed ``i``; without a task, a seed drawn from this env's generator.

        Returns:
            The first observation's text and ``info`` with ``task_id`` and ``seed``.

        Raises:
            ClosedError: The env is closed.
            ConfigError: ``action_field`` names no field of the server's action.
            RemoteEnvError: The server failed (module docstring).
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        await super().reset(seed=seed)
        if self._schema is None:
            self._schema = await self._fetch_schema()
        index = (options or {}).get("task")
        if index is None:
            index = int(self.np_random.integers(len(self._tasks.ids)))
        elif not 0 <= int(index) < len(self._tasks.ids):
            raise ConfigError(f"{PREFIX}{self.name}: task index {index} out of range [0, {len(self._tasks.ids)})")
        body = await self._ask("reset", {"seed": int(index)})
        self._task_id, self._done, self._refused = self._tasks.ids[int(index)], bool(body.get("done")), 0
        return observation_text(body["observation"], self._obs_field), {"task_id": self._task_id, "seed": int(index)}

    async def step(self, action: str) -> StepResult[str]:
        """Play the reply as the server's action.

        Returns:
            The observation's text, the step's reward (null: 0), ``terminated = done``, ``truncated =
            False``; ``info``: ``task_id``, and ``action_error`` when the reply was not a valid action
            (then the observation says why, the reward is 0, and the episode goes on unless it was the
            ``max_refused``-th such reply in a row: then ``truncated``).

        Raises:
            ResetNeeded: No episode is running.
            RemoteEnvError: The server failed (module docstring).
        """
        if self._done:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        info: dict[str, Any] = {"task_id": self._task_id}
        data = {self._field: action} if self._field is not None else parse_action(action)
        refused = data if isinstance(data, str) else None
        if refused is None:
            body = await self._ask("step", data)
            refused = body.get("refused")
        if refused is not None:
            info["action_error"] = refused
            self._refused += 1
            self._done = self._refused >= self._max_refused  # cut: truncated, not terminated
            return StepResult(f"Invalid action: {refused.rstrip('.')}.", 0.0, False, self._done, info)
        self._refused = 0
        self._done = bool(body.get("done"))
        reward = body.get("reward")
        return StepResult(observation_text(body["observation"], self._obs_field),
                          0.0 if reward is None else float(reward), self._done, False, info)

    async def close(self) -> None:
        """End the session (a ``close`` message), then this env."""
        if self._socket is not None:
            try:
                await self._socket.send(json.dumps({"type": "close", "data": {}}))
            except Exception:  # the server is gone already
                pass
            await self._drop()
        await super().close()

    def __repr__(self) -> str:
        return f"<OpenEnvEnv {self.name} at {self.url}>"


def listed_ids() -> list[str]:
    """None: an OpenEnv server is named when used (``agentenv envs`` shows the pattern ``openenv/<NAME>``)."""
    return []


def needs(name: str) -> tuple[str, ...]:
    """Nothing besides the ``websockets`` client; the server's address is a keyword argument."""
    return ()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``openenv/<NAME>`` (any name: the server is given by ``url=``)."""
    name = agentenv_id[len(PREFIX):]
    return {"name": name} if name and "/" not in name else None
