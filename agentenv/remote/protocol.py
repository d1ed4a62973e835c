"""The wire protocol between ``agentenv serve`` and :class:`~agentenv.remote.client.RemoteEnv`.

JSON over HTTP, one session per episode. Every answer is a JSON object; an error is
``{"error": {"kind": KIND, "message": TEXT}}`` with the HTTP status :data:`ERROR_STATUS` gives KIND.

========  =========================  ==========================================================
Method    Path                       Body -> answer
========  =========================  ==========================================================
GET       ``/health``                -> ``{"status": "ok", "env", "sessions", "protocol"}``
GET       ``/info``                  -> :func:`describe`'s object (roles, tools, limits)
GET       ``/tasks``                 -> ``{"tasks": null | {"ids", "kinds"}, "split"}``
POST      ``/sessions``              ``{"request_id", "seed"?, "options"?}`` -> 201
                                     ``{"session", "observation", "info", "system_prompt", "tools"}``
POST      ``/sessions/{id}/step``    ``{"action", "step"}`` -> ``{"observation", "reward",
                                     "terminated", "truncated", "info", "step"}``
DELETE    ``/sessions/{id}``         -> ``{"closed": true}``
========  =========================  ==========================================================

Idempotency. ``POST /sessions`` carries a client-chosen ``request_id``: a repeat of it returns the
session it created. A step carries its index ``step`` (0 for the first step of the episode): a repeat
of the last index returns the stored answer of that step. So every call may be retried after a lost
answer without playing anything twice.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

#: Bumped when a request or answer changes shape; ``/info`` and ``/health`` report it.
PROTOCOL_VERSION = 1

#: Error kind -> HTTP status. Kinds are the stable part; clients branch on them, not on the status.
ERROR_STATUS: Mapping[str, int] = {
    "bad_request": 400,  # the body is not JSON, or a field is missing or has the wrong type
    "unauthorized": 401,  # the server has a token and the request did not carry it
    "not_found": 404,  # no such route
    "unknown_session": 404,  # no such session (never created, closed, expired, or its env failed)
    "method_not_allowed": 405,
    "episode_over": 409,  # a step after the episode terminated or was truncated
    "out_of_order": 409,  # a step index that is neither the next one nor a repeat of the last
    "too_large": 413,  # the body or the action exceeds the server's cap
    "env_error": 500,  # the environment raised in reset or step (the session is closed)
    "internal": 500,  # a bug in the server
    "capacity": 503,  # the server holds ``max_sessions`` sessions already
    "env_timeout": 504,  # the environment did not answer within the server's ``call_timeout_s``
}

#: Kinds that may go away on their own: an idempotent call answered one of them is retried.
RETRYABLE_KINDS = frozenset({"capacity"})


def error_body(kind: str, message: str) -> dict[str, Any]:
    """The JSON object of a typed error.

    Raises:
        KeyError: ``kind`` is not one of :data:`ERROR_STATUS`.
    """
    ERROR_STATUS[kind]  # noqa: B018 (refuse unknown kinds here, not on the client)
    return {"error": {"kind": kind, "message": message}}


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON types: numpy scalars and arrays to numbers and lists, tuples to lists.

    Anything else JSON cannot hold becomes its ``str``; non-finite floats become None (JSON has no NaN).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    item = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(item):
        return jsonable(item())
    return str(value)


def dumps(value: Any) -> bytes:
    """Compact UTF-8 JSON of :func:`jsonable` ``(value)``."""
    return json.dumps(jsonable(value), separators=(",", ":"), ensure_ascii=False).encode()


def body_cap(max_action_chars: int) -> int:
    """The largest request body (bytes) a server with ``max_action_chars`` reads.

    A character takes at most 6 bytes in JSON (a backslash-u escape and 4 hex digits); 4 KiB more
    leave room for the other fields.
    """
    return 6 * max_action_chars + 4096
