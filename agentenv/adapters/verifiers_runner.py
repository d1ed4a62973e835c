"""The process behind ``verifiers/<NAME>``: a verifiers environment's rollouts against an OpenAI endpoint.

Run by :mod:`agentenv.adapters.verifiers_env` under the interpreter of the user's verifiers
environment (which need not have agentenv: this file imports only the standard library, verifiers and
``openai``, which verifiers brings)::

    PYTHON verifiers_runner.py --env NAME [--env-args JSON]

It loads the environment once (``verifiers.load_environment(NAME, **env_args)``), then speaks JSON lines:

* out, first: ``{"type": "ready", "train": N, "eval": M or null, "verifiers": VERSION}``: the sizes of
  the environment's dataset and eval dataset (null: it has none, and verifiers falls back to the
  dataset); or ``{"type": "fatal", "error": TEXT}`` and exit status 2 when the environment does not load.
* in: ``{"id": K, "split": "train" | "eval", "index": I, "base_url": URL, "api_key": KEY, "model": NAME}``:
  play row ``I`` of that split with an ``AsyncOpenAI`` client holding that key (the endpoint's session).
* out: ``{"type": "result", "id": K, "reward": R, "metrics": {...}, "truncated": bool, "stop": NAME,
  "error": TEXT or null, "rollout_s": SECONDS}``: the environment's own rollout loop
  (``Environment.run_rollout``: its prompts, tools, parsers and stop conditions) scored by its own
  rubric. ``error`` is the error the rollout ended with (verifiers records it in the state instead of
  raising), or an exception of the rollout itself; ``rollout_s`` the wall time of ``run_rollout``.

Rollouts run concurrently, as many as requests arrive. The protocol owns the real standard output;
anything the environment prints goes to standard error. End of input ends the process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any


def _open_protocol_stream():
    """The real stdout for the protocol; fd 1 then points at stderr, so prints cannot corrupt it."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        return repr(value)


def _dataset_size(get) -> int | None:
    try:
        return len(get())
    except ValueError:  # "dataset is not set"
        return None


def _eval_size(env) -> int | None:
    env.build_eval_dataset()
    return None if env.eval_dataset is None else len(env.eval_dataset)


async def _play(env, request: dict, rows: dict, clients: dict) -> dict:
    from openai import AsyncOpenAI
    from verifiers.clients import OpenAIChatCompletionsClient

    split = request["split"]
    if split not in rows:
        rows[split] = (env.get_eval_dataset() if split == "eval" else env.get_dataset()).to_list()
    row = rows[split][int(request["index"])]
    base = clients.get(request["base_url"])
    if base is None:  # building a client costs 30-70 ms (its TLS context); a copy with another key, 0.2 ms
        base = clients[request["base_url"]] = AsyncOpenAI(base_url=request["base_url"], api_key="-", max_retries=0)
    client = OpenAIChatCompletionsClient(base.with_options(api_key=request["api_key"]))
    t0 = time.perf_counter()
    out = await env.run_rollout(row, client, request["model"], {})
    error = out.get("error")
    return {"reward": _jsonable(out.get("reward")), "metrics": _jsonable(out.get("metrics") or {}),
            "truncated": bool(out.get("is_truncated")), "stop": _jsonable(out.get("stop_condition")),
            "error": None if error is None else str(error), "rollout_s": time.perf_counter() - t0}


async def _serve(env, out) -> None:
    rows: dict[str, list] = {}
    clients: dict[str, Any] = {}  # one AsyncOpenAI per endpoint; each request a copy with its session's key
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    pending: set[asyncio.Task] = set()

    async def one(request: dict) -> None:
        try:
            result = await _play(env, request, rows, clients)
        except Exception as exc:  # the rollout itself raised: report it, keep serving the others
            result = {"reward": None, "metrics": {}, "truncated": False, "stop": None,
                      "error": f"{type(exc).__name__}: {exc}", "rollout_s": None}
        out.write(json.dumps({"type": "result", "id": request.get("id"), **result}) + "\n")

    while line := await reader.readline():
        task = asyncio.create_task(one(json.loads(line)))
        pending.add(task)
        task.add_done_callback(pending.discard)
    if pending:
        await asyncio.gather(*pending)
    for client in clients.values():
        await client.close()


def main(argv: list[str] | None = None) -> int:
    """Load the environment, announce it, serve rollout requests until end of input; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, help="the verifiers environment's id (verifiers.load_environment)")
    parser.add_argument("--env-args", default="{}", help="keyword arguments of load_environment, as a JSON object")
    args = parser.parse_args(argv)
    out = _open_protocol_stream()
    try:
        import verifiers

        env = verifiers.load_environment(args.env, **json.loads(args.env_args))
        ready = {"type": "ready", "train": _dataset_size(env.get_dataset), "eval": _eval_size(env),
                 "verifiers": getattr(verifiers, "__version__", "unknown")}
    except Exception as exc:
        out.write(json.dumps({"type": "fatal", "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 2
    out.write(json.dumps(ready) + "\n")
    asyncio.run(_serve(env, out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
