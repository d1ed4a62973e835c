"""An agent program plus a reward function as a trainable environment.

The agent is ordinary code written against the OpenAI API (the ``openai`` package, its own loop and
tools). During an episode it talks to :class:`~agentenv.agents.endpoint.AgentEndpoint`, which answers
with the policy through the generation engine and records the exact token rows; the reward function
then scores what the agent returned. Register one like any env::

    agentenv.register("me/Calc-v0", "agentenv.agents:AgentEnv",
                      agent="my_pkg.agent:solve", reward="my_pkg.agent:score", tasks="my_pkg.agent:TASKS")

``agent`` is one of

* a callable ``agent(task, ctx)`` (``async`` or not; a plain function runs in a worker thread, so the
  synchronous ``openai.OpenAI`` client works): ``ctx`` is an :class:`AgentContext` with ``base_url``,
  ``api_key``, ``model`` (``ctx.client()`` / ``ctx.async_client()`` build ``openai`` clients);
* a ``module:function`` string naming such a callable;
* a command, as a list of arguments (``["/home/me/venv/bin/python", "agent.py"]``, ``["node",
  "agent.js"]``): run as given, so the agent runs in the user's own environment with its own
  packages, with ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENTENV_MODEL`` and ``AGENTENV_TASK`` (the
  task as JSON) in its environment; a program that builds ``OpenAI()`` from the environment runs
  unmodified; its output is its standard output;
* a path to a Python script: the command ``[sys.executable, SCRIPT]``, i.e. agentenv's own
  interpreter (which has the ``openai`` package when agentenv's ``serve`` extra is installed).

``reward(task, output) -> float`` (``async`` or not, or a ``module:function`` string) scores the
agent's return value (or the script's stripped stdout). Weight updates reach the agent's requests as
any rollout's: the engine interrupts them at a token boundary and continues from the prefix.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv.agents.endpoint import DEFAULT_MODEL, AgentEndpoint
from agentenv.agents.session import finish_samples
from agentenv.core import Env, StepResult, TaskSet
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.rollout.episode import RolloutConfig
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.engines.base import GenerationEngine
    from agentenv.rollout.chat import ChatRenderer
    from agentenv.rollout.tool_calls import ToolCallParser

#: Characters of a failed script's stderr kept in ``info["error"]``.
_STDERR_TAIL = 2000
#: Characters of the agent's output kept in ``info["agent_output"]``.
_OUTPUT_CHARS = 1000


@dataclass(frozen=True)
class AgentContext:
    """What an agent callable needs to reach the policy for one episode.

    Attributes:
        base_url: ``http://127.0.0.1:PORT/v1``.
        api_key: The episode's session id.
        model: A model name the endpoint serves.
        seed: The episode's seed.
    """

    base_url: str
    api_key: str
    model: str
    seed: int | None = None

    def client(self, **kw: Any) -> Any:
        """An ``openai.OpenAI`` client of this episode (no retries unless asked)."""
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key, **{"max_retries": 0, **kw})

    def async_client(self, **kw: Any) -> Any:
        """An ``openai.AsyncOpenAI`` client of this episode."""
        import openai

        return openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, **{"max_retries": 0, **kw})


def _resolve(target: Any, what: str) -> Any:
    if not isinstance(target, str) or ":" not in target:
        return target
    module, _, name = target.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"AgentEnv {what} {target!r} cannot be imported: {exc}") from exc
    return obj


class AgentEnv(Env[str, str]):
    """An OpenAI-API agent program and a reward function, played through the agentenv endpoint.

    Args:
        agent: The agent (see the module docstring): a callable, ``"module:function"``, a command (a
            list of arguments) or a script path.
        reward: ``reward(task, output) -> float``, or ``"module:function"``.
        tasks: The tasks (strings or JSON values; a dict's ``"id"`` names it), a ``"module:name"`` of
            such a list, or None: the task is the episode's seed. Task ``seed % len(tasks)`` is played,
            ``reset(options={"task": i})`` plays task ``i`` (held-out evaluation).
        tool_parser: The tool-call parser's registered name (``agentenv.rollout.tool_calls``); None: the one
            the chat template implies (the trainer fills it from the template), else ``hermes``.
        models: Model names the agent may ask for (its hard-coded name, e.g. ``"gpt-4o-mini"``);
            the first is the one it is told (``ctx.model``, ``AGENTENV_MODEL``).
        timeout_s: Wall-clock limit of one agent run (seconds); past it the episode fails.

    Raises:
        ConfigError: ``agent``/``reward``/``tasks`` cannot be imported or are of the wrong kind, a
            script path that does not exist, a command whose program is not found, an empty task
            list, an unknown ``tool_parser``.
    """

    def __init__(self, agent: Any, reward: Any, tasks: Any = None, *, tool_parser: str | None = None,
                 models: Sequence[str] = (DEFAULT_MODEL,), timeout_s: float = 600.0) -> None:
        self.agent = _resolve(agent, "agent")
        if isinstance(self.agent, str | Path):
            if not Path(self.agent).is_file():
                raise ConfigError(f"AgentEnv agent script {str(self.agent)!r} does not exist")
            self.agent = (sys.executable, str(self.agent))
        elif isinstance(self.agent, list | tuple):
            if not self.agent or not all(isinstance(a, str) for a in self.agent):
                raise ConfigError(f"AgentEnv agent command must be a non-empty list of strings, got {agent!r}")
            if shutil.which(self.agent[0]) is None:
                raise ConfigError(f"AgentEnv agent command: the program {self.agent[0]!r} is not found "
                                  "(give its path, or put it on PATH)")
            self.agent = tuple(self.agent)
        elif not callable(self.agent):
            raise ConfigError(f"AgentEnv agent must be a callable, 'module:function', a command (a list of "
                              f"arguments) or a script path, got {agent!r}")
        self.reward_fn = _resolve(reward, "reward")
        if not callable(self.reward_fn):
            raise ConfigError(f"AgentEnv reward must be a callable or 'module:function', got {reward!r}")
        tasks = _resolve(tasks, "tasks")
        self.task_list = None if tasks is None else list(tasks() if callable(tasks) else tasks)
        if self.task_list is not None and not self.task_list:
            raise ConfigError("AgentEnv tasks is empty")
        from agentenv.rollout.tool_calls import get_tool_parser

        self.tool_parser = tool_parser
        self._parser = get_tool_parser(tool_parser) if tool_parser else None
        self.models = tuple(models)
        if not self.models:
            raise ConfigError("AgentEnv models must name at least one model")
        self.timeout_s = timeout_s
        self.endpoint: AgentEndpoint | None = None
        self.last_session: Any = None  #: the latest episode's AgentSession (its engine calls in ``log``)
        self._task: Any = None
        self._threads: ThreadPoolExecutor | None = None  # this env's own: agents block, the loop's pool must not

    def _thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._threads is None:
            self._threads = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentenv-agent")
        return asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)

    # -- tasks ----------------------------------------------------------------------------------
    def _task_id(self, i: int) -> str:
        task = self.task_list[i]  # type: ignore[index]
        return str(task["id"]) if isinstance(task, Mapping) and "id" in task else f"task-{i}"

    def tasks(self) -> TaskSet | None:
        """The task list as a :class:`TaskSet` (None without a list)."""
        if self.task_list is None:
            return None
        return TaskSet(tuple(self._task_id(i) for i in range(len(self.task_list))), ("",) * len(self.task_list))

    def _pick(self, seed: int | None, options: Mapping[str, Any] | None) -> tuple[Any, str]:
        if self.task_list is None:
            return seed, str(seed)
        i = int((options or {}).get("task", (seed or 0) % len(self.task_list)))
        return self.task_list[i], self._task_id(i)

    async def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[str, dict]:
        """Pick the task (the agent program plays it: see :meth:`play_episode`); the observation is its JSON."""
        await super().reset(seed=seed)
        self._task, task_id = self._pick(seed, options)
        return json.dumps(self._task), {"task_id": task_id}

    async def step(self, action: str) -> StepResult[str]:
        """Not used: the agent program drives the episode (``play_episode``).

        Raises:
            AgentEnvError: Always.
        """
        raise AgentEnvError("AgentEnv is played by its agent program through play_episode (the rollout loop "
                            "calls it); step() is not used")

    # -- episodes -------------------------------------------------------------------------------
    async def _endpoint(self, engine: GenerationEngine, renderer: ChatRenderer) -> AgentEndpoint:
        if self.endpoint is not None and (self.endpoint.engine is not engine or self.endpoint.renderer is not renderer):
            await self.endpoint.close()
            self.endpoint = None
        if self.endpoint is None:
            self.endpoint = AgentEndpoint(engine, renderer, models=self.models)
            await self.endpoint.start()
        return self.endpoint

    def _parser_for(self, renderer: ChatRenderer) -> ToolCallParser:
        if self._parser is None:
            from agentenv.rollout.tool_calls import get_tool_parser

            self._parser = get_tool_parser(renderer.tool_parser_name or "hermes")
        return self._parser

    async def play_episode(self, engine: GenerationEngine, renderer: ChatRenderer, cfg: RolloutConfig, *,
                           seed: int | None = None, options: Mapping[str, Any] | None = None,
                           version_fn: Callable[[], int] | None = None) -> list[Trajectory]:
        """Run the agent on one task through the endpoint; return the episode's samples, scored.

        Called by :func:`agentenv.rollout.episode.run_episode_samples`. Never raises for the agent's or the
        reward's failures: they make the episode ``status="error"`` (``info["error"]``), which the
        collector replays. An agent that failed because the episode's token budget was spent (its
        request was refused) ends ``completed`` with ``info["truncation"]`` and reward 0.
        """
        version = version_fn or (lambda: engine.version)
        endpoint = await self._endpoint(engine, renderer)
        task, task_id = self._pick(seed, options)
        session = endpoint.open_session(cfg, self._parser_for(renderer), version)
        ctx = AgentContext(endpoint.base_url, session.id, self.models[0], seed)
        output, error = None, None
        limit = min(self.timeout_s, cfg.episode_deadline_s or float("inf"))
        try:
            output = await asyncio.wait_for(self._run_agent(task, ctx), limit)
        except TimeoutError:
            error = f"the agent ran past {limit:g} s"
            session.info["straggler"] = "episode"
        except Exception as exc:
            error = f"agent raised {type(exc).__name__}: {exc}"
        finally:
            async with session.lock:  # a request in flight finishes before the record is read
                self.last_session = endpoint.close_session(session.id)
        info = {**session.info, "task_id": task_id, "agent_requests": session.info["turns"]}
        samples = session.samples or [Trajectory(start_version=version())]
        status, reward = "completed", 0.0
        if error is not None and info["truncation"] is None:
            status, info["error"] = "error", error
        elif error is None:
            info["agent_output"] = str(output)[:_OUTPUT_CHARS]
            try:
                reward = await self._reward(task, output)
            except Exception as exc:
                status, info["error"] = "error", f"reward raised {type(exc).__name__}: {exc}"
        else:
            info["agent_error"] = error
        finish_samples(samples, info, reward=reward, status=status, version=version())
        return samples

    async def _run_agent(self, task: Any, ctx: AgentContext) -> Any:
        if isinstance(self.agent, tuple):
            return await self._run_command(self.agent, task, ctx)
        if inspect.iscoroutinefunction(self.agent):
            return await self.agent(task, ctx)
        return await self._thread(self.agent, task, ctx)

    @staticmethod
    async def _run_command(argv: Sequence[str], task: Any, ctx: AgentContext) -> str:
        env = {**os.environ, "OPENAI_BASE_URL": ctx.base_url, "OPENAI_API_KEY": ctx.api_key,
               "AGENTENV_MODEL": ctx.model, "AGENTENV_TASK": json.dumps(task)}
        proc = await asyncio.create_subprocess_exec(*argv, env=env,
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-_STDERR_TAIL:]
            raise AgentEnvError(f"agent command {' '.join(argv)!r} exited with status {proc.returncode}: {tail}")
        return out.decode(errors="replace").strip()

    async def _reward(self, task: Any, output: Any) -> float:
        if inspect.iscoroutinefunction(self.reward_fn):
            value = await self.reward_fn(task, output)
        else:  # scoring may compute: off the event loop
            value = await self._thread(self.reward_fn, task, output)
        return float(value)

    async def close(self) -> None:
        """Stop the endpoint. Safe to call twice."""
        if self.endpoint is not None:
            await self.endpoint.close()
            self.endpoint = None
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            self._threads = None
        await super().close()
