"""``verifiers/<NAME>``: a verifiers environment (prime-rl's hub, PyPI ``verifiers``) played unchanged.

A verifiers environment is its own rollout loop: it builds the prompt from a dataset row, asks a model
through an OpenAI client, answers with its tools or its own ``env_response``, decides when the rollout
stops, and scores it with its rubric. agentenv runs that loop as an agent program
(:class:`~agentenv.agents.AgentEnv`): every model call goes to agentenv's OpenAI-compatible endpoint,
which answers with the policy and records the exact token rows (behaviour log-probabilities, policy
version per segment); the rollout's reward is the rubric's score::

    agentenv train --env verifiers/my-env env.kwargs.python=/path/to/venv/bin/python

verifiers and the environment's own packages stay in their own Python environment (verifiers brings
about a hundred packages: datasets, anthropic, mcp, ...; ``scripts/install_verifiers.sh`` makes
``.venv-verifiers``). One process per environment (:mod:`agentenv.adapters.verifiers_runner`, under
that interpreter) loads it once and plays every episode of every worker of this process, concurrently.

The mapping onto agentenv's contract:

* **Tasks.** The rows of the environment's dataset (``split="train"``) or of its eval dataset
  (``split="eval"``; verifiers falls back to the dataset when there is none), in their order; task
  ``i`` is row ``i``. Set ``env.eval_kwargs.split=eval`` for held-out evaluation on the eval rows.
* **Reward.** The rubric's weighted score of the rollout; its metrics go to ``info["verifiers_metrics"]``.
* **Failures.** A rollout that ended with an error (verifiers records it in its state): when the
  endpoint refused the request because the episode's token budget was spent, the episode ends
  truncated with reward 0, as any agent's; otherwise, and when the process dies, the episode fails
  (never reward 0) and the collector replays it; the next episode starts a new process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentenv.agents.env import AgentContext, AgentEnv
from agentenv.errors import AgentEnvError, ConfigError

PREFIX = "verifiers/"
RUNNER = Path(__file__).with_name("verifiers_runner.py")
PYTHON_VAR = "AGENTENV_VERIFIERS_PYTHON"
"""Environment variable naming the interpreter of the verifiers environment (else ``.venv-verifiers``)."""
_STDERR_TAIL = 2000


def default_python() -> Path:
    """``$AGENTENV_VERIFIERS_PYTHON``, else ``.venv-verifiers/bin/python`` in the working directory."""
    return Path(os.environ.get(PYTHON_VAR) or Path.cwd() / ".venv-verifiers" / "bin" / "python")


def _argv(python: Path, name: str, env_args: Mapping[str, Any]) -> list[str]:
    return [str(python), str(RUNNER), "--env", name, "--env-args", json.dumps(dict(env_args), sort_keys=True)]


_sizes: dict[tuple[str, ...], dict] = {}


def describe(python: Path, name: str, env_args: Mapping[str, Any], timeout_s: float = 300.0) -> dict:
    """The runner's ready line (dataset sizes, verifiers version), once per interpreter, env and arguments.

    Raises:
        ConfigError: The interpreter does not exist, verifiers is not installed there, the environment
            does not load (its module is not installed, its arguments are wrong, it needs a download),
            or it does not answer within ``timeout_s`` seconds.
    """
    argv = _argv(python, name, env_args)
    key = tuple(argv)
    if key in _sizes:
        return _sizes[key]
    if not python.is_file():
        raise ConfigError(f"verifiers/{name}: no Python at {python} (env.kwargs.python, or ${PYTHON_VAR}; "
                          "bash scripts/install_verifiers.sh makes .venv-verifiers)")
    try:
        done = subprocess.run(argv, input="", capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise ConfigError(f"verifiers/{name}: the environment did not load within {timeout_s:g} s") from exc
    first = (done.stdout.splitlines() or [""])[0]
    try:
        ready = json.loads(first)
    except json.JSONDecodeError:
        ready = {"type": "fatal", "error": f"exit status {done.returncode}: {done.stderr[-_STDERR_TAIL:]}"}
    if ready.get("type") != "ready":
        raise ConfigError(f"verifiers/{name} does not load under {python}: {ready.get('error')}")
    _sizes[key] = ready
    return ready


class _Runner:
    """One runner process (:mod:`agentenv.adapters.verifiers_runner`) and its requests in flight."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: asyncio.subprocess.Process | None = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.ids = itertools.count()
        self.users = 0
        self._reader: asyncio.Task | None = None
        self._stderr: asyncio.Task | None = None
        self._err_tail = ""
        self._starting = asyncio.Lock()

    async def _ensure(self) -> tuple[asyncio.subprocess.Process, asyncio.Task]:
        async with self._starting:
            if self.proc is None or self.proc.returncode is not None or self._reader is None or self._reader.done():
                self._err_tail = ""
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, limit=2**24)
                self._stderr = asyncio.create_task(self._drain_stderr(self.proc))
                line = await self.proc.stdout.readline()
                ready = json.loads(line) if line.strip() else {"type": "fatal", "error": "no answer"}
                if ready.get("type") != "ready":
                    await self.proc.wait()
                    await self._stderr
                    raise AgentEnvError(f"verifiers runner did not start: {ready.get('error')} {self._err_tail}")
                self._reader = asyncio.create_task(self._read(self.proc, self._stderr))
            return self.proc, self._reader

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        while chunk := await proc.stderr.read(65536):
            self._err_tail = (self._err_tail + chunk.decode(errors="replace"))[-_STDERR_TAIL:]

    async def _read(self, proc: asyncio.subprocess.Process, stderr: asyncio.Task) -> None:
        """Hand each result line to its request; returns when the process has exited."""
        while line := await proc.stdout.readline():
            msg = json.loads(line)
            fut = self.waiting.pop(msg.get("id"), None)
            if fut is not None and not fut.done():
                fut.set_result(msg)
        await proc.wait()
        await stderr

    async def play(self, request: dict) -> dict:
        """Send one rollout request; its result line.

        Raises:
            AgentEnvError: The process did not start, or exited before answering (with its status and
                the tail of its standard error).
        """
        proc, reader = await self._ensure()
        rid = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        try:
            proc.stdin.write((json.dumps({**request, "id": rid}) + "\n").encode())
            await proc.stdin.drain()
            await asyncio.wait({fut, reader}, return_when=asyncio.FIRST_COMPLETED)
        except (BrokenPipeError, ConnectionResetError):
            await reader
        finally:
            self.waiting.pop(rid, None)
        if fut.done():
            return fut.result()
        raise AgentEnvError(f"verifiers runner exited with status {proc.returncode}: {self._err_tail}")

    async def close(self) -> None:
        """End the process (end of input, then a kill after 5 s)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.returncode is None:
            proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._reader is not None:
            await self._reader


#: The runner processes of each event loop, by command: every env of a loop with the same
#: interpreter, environment and arguments shares one.
_runners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, ...], _Runner]] = (
    weakref.WeakKeyDictionary())


class VerifiersEnv(AgentEnv):
    """A verifiers environment's rollouts, played through agentenv's endpoint (see the module docstring).

    Args:
        name: The verifiers environment's id (``verifiers.load_environment(name)``; installed in the
            interpreter's environment, e.g. ``prime env install`` or ``pip install``).
        python: That environment's interpreter; default :func:`default_python`.
        env_args: Keyword arguments of ``load_environment`` (JSON values).
        split: ``"train"`` (the dataset's rows) or ``"eval"`` (the eval dataset's).
        num_tasks: Use only the first ``num_tasks`` rows.
        tool_parser, timeout_s: As :class:`~agentenv.agents.AgentEnv`.

    Raises:
        ConfigError: An unknown ``split``, ``num_tasks`` below 1, an interpreter or environment that
            does not load (:func:`describe`), a split without rows.
    """

    def __init__(self, name: str, *, python: str | Path | None = None, env_args: Mapping[str, Any] | None = None,
                 split: str = "train", num_tasks: int | None = None, tool_parser: str | None = None,
                 timeout_s: float = 600.0) -> None:
        if split not in ("train", "eval"):
            raise ConfigError(f"verifiers/{name}: split must be 'train' or 'eval', got {split!r}")
        if num_tasks is not None and num_tasks < 1:
            raise ConfigError(f"verifiers/{name}: num_tasks must be at least 1, got {num_tasks}")
        self.name, self.split = name, split
        self.python = Path(python) if python is not None else default_python()
        self.env_args = dict(env_args or {})
        ready = describe(self.python, name, self.env_args)
        size = ready["eval"] if split == "eval" and ready["eval"] is not None else ready["train"]
        if not size:
            raise ConfigError(f"verifiers/{name} has no {split} rows")
        size = min(size, num_tasks or size)
        tasks = [{"id": f"{name}/{split}-{i}", "split": split, "index": i} for i in range(size)]
        super().__init__(self._rollout, self._score, tasks, tool_parser=tool_parser, timeout_s=timeout_s)
        self._key = tuple(_argv(self.python, name, self.env_args))
        self._runner: _Runner | None = None
        self.last_result: dict | None = None  #: the latest rollout's result line (reward, metrics, stop)

    async def _rollout(self, task: Mapping[str, Any], ctx: AgentContext) -> dict:
        if self._runner is None:
            here = _runners.setdefault(asyncio.get_running_loop(), {})
            if self._key not in here:
                here[self._key] = _Runner(list(self._key))
            self._runner = here[self._key]
            self._runner.users += 1
        result = await self._runner.play({"split": task["split"], "index": task["index"],
                                          "base_url": ctx.base_url, "api_key": ctx.api_key, "model": ctx.model})
        if result.get("error") is not None:
            raise AgentEnvError(f"verifiers/{self.name} rollout ended with an error: {result['error']}")
        self.last_result = result
        return result

    def _score(self, task: Mapping[str, Any], result: Mapping[str, Any]) -> float:
        reward = result.get("reward")
        if not isinstance(reward, int | float):
            raise AgentEnvError(f"verifiers/{self.name} returned no numeric reward: {reward!r}")
        return float(reward)

    async def play_episode(self, *args: Any, **kwargs: Any) -> list:
        """As :meth:`AgentEnv.play_episode`; the first sample's ``info`` also holds the rubric's metrics."""
        self.last_result = None
        samples = await super().play_episode(*args, **kwargs)
        output = self.last_result
        if samples and output is not None:
            samples[0].info["verifiers_metrics"] = output.get("metrics", {})
            samples[0].info["verifiers_stop"] = output.get("stop")
        return samples

    async def close(self) -> None:
        """Stop the endpoint, and the runner process when no other env of this process uses it."""
        if self._runner is not None:
            self._runner.users -= 1
            if self._runner.users == 0:
                _runners.get(asyncio.get_running_loop(), {}).pop(self._key, None)
                await self._runner.close()
            self._runner = None
        await super().close()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``verifiers/<NAME>`` or ``verifiers/<ORG>/<NAME>``.

    An ``ORG/NAME`` hub id loads the module ``NAME`` (``-`` read as ``_``), as verifiers does.
    """
    name = agentenv_id[len(PREFIX):]
    parts = name.split("/")
    return {"name": name} if len(parts) <= 2 and all(parts) else None


def listed_ids() -> list[str]:
    """None: any installed verifiers environment is a valid name (``agentenv envs`` shows the pattern)."""
    return []


def needs(name: str) -> tuple[str, ...]:
    """Nothing checkable from here: the environment's own interpreter reports what it lacks."""
    return ()
