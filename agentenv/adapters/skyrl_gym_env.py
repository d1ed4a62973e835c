"""``skyrl_gym/<ID>``: SkyRL-gym's environments (PyPI ``skyrl-gym``), e.g. ``skyrl_gym/gsm8k``.

A SkyRL-gym environment is built once per task: ``skyrl_gym.make(ID, env_config=..., extras=row)``
takes the task's dataset row (its ``reward_spec``, ``extra_info``, ...), ``init(prompt)`` receives the
task's chat prompt and ``step(reply) -> {observations, reward, done, metadata}`` grades a reply and
returns the next messages. Its tasks therefore come from a dataset in SkyRL's layout, one row a task:

.. code-block:: json

    {"prompt": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."}],
     "env_class": "gsm8k", "reward_spec": {"method": "rule", "ground_truth": "72"},
     "extra_info": {"split": "test", "index": 0}, "data_source": "openai/gsm8k"}

read from ``data`` (a ``.jsonl`` file, one row a line, or ``.parquet`` with pandas and pyarrow):
``agentenv train --env skyrl_gym/gsm8k env.kwargs.data=train.jsonl``. The adapter maps the pieces onto
agentenv's contract unchanged: the prompt's leading system messages become the episode's
:attr:`~agentenv.core.Env.system_prompt` and its one user message the ``reset`` observation; each
step's reward passes through (the episode's return is their sum, as in SkyRL); ``done`` is
``terminated``; the observation messages are joined into one ``user`` message; SkyRL's ``metadata``
and ``postprocessed_action`` stay in ``info``, and at the episode's end its ``get_metrics()`` too.

SkyRL's ``step`` is synchronous and may block (SQL, a search server): it runs in a worker thread.
Environments that execute code (``lcb``, ``searchcode``) run it SkyRL's way, in a subprocess of this
machine, not in agentenv's sandbox.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv.core import Env, StepResult, TaskSet, text_space
from agentenv.errors import ClosedError, ConfigError, DataError, ResetNeeded

PREFIX = "skyrl_gym/"
ROW_PROMPT, ROW_ENV = "prompt", "env_class"


def skyrl_registry() -> dict[str, Any]:
    """SkyRL-gym's registry of environment ids (``skyrl_gym.registry``; importing it registers its own envs)."""
    import skyrl_gym

    return skyrl_gym.registry


def _plain(value: Any) -> Any:
    """``value`` with numpy arrays and scalars (as pandas reads parquet) turned into lists and Python numbers."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The dataset rows of ``path``: a ``.jsonl`` file (one JSON object a line) or a ``.parquet`` file.

    Raises:
        ConfigError: The file does not exist, has another suffix, or is parquet without pandas/pyarrow.
        DataError: A line is not a JSON object, or the file holds no rows.
    """
    if not path.is_file():
        raise ConfigError(f"skyrl_gym: data file {path} does not exist")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not JSON ({exc.msg})") from exc
            if not isinstance(row, dict):
                raise DataError(f"{path}:{number}: a row must be a JSON object, got {type(row).__name__}")
            rows.append(row)
    elif path.suffix == ".parquet":
        try:
            import pandas
            rows = [_plain(r) for r in pandas.read_parquet(path).to_dict(orient="records")]
        except ImportError as exc:
            raise ConfigError(f"skyrl_gym: reading {path} needs pandas and pyarrow ({exc})") from exc
    else:
        raise ConfigError(f"skyrl_gym: data must be a .jsonl or .parquet file, got {path}")
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def split_prompt(prompt: Any, where: str) -> tuple[str | None, str]:
    """A SkyRL prompt as ``(system prompt or None, the user message)``.

    Args:
        prompt: A string (the user message) or chat messages: system messages first, then one user message.
        where: Names the row in errors.

    Raises:
        DataError: Any other shape (no user message, two of them, an assistant turn, non-string content).
    """
    if isinstance(prompt, str):
        return None, prompt
    if not isinstance(prompt, Sequence) or not prompt or not all(isinstance(m, Mapping) for m in prompt):
        raise DataError(f"{where}: prompt must be a string or a list of chat messages, got {prompt!r:.200}")
    *head, last = prompt
    if last.get("role") != "user" or any(m.get("role") != "system" for m in head) or not all(
            isinstance(m.get("content"), str) for m in prompt):
        roles = [m.get("role") for m in prompt]
        raise DataError(f"{where}: prompt must be system messages then one user message with text, got roles {roles}")
    system = "\n\n".join(m["content"] for m in head) if head else None
    return system, last["content"]


class SkyRLGymEnv(Env[str, str]):
    """A SkyRL-gym environment behind agentenv's asynchronous contract, one dataset row a task.

    Tasks: row ``i`` of ``data`` (ids ``"<ID>/<i>"``, kinds the row's ``data_source`` or the ID);
    ``reset(options={"task": i})`` plays it, ``reset(seed=s)`` without a task plays a row drawn from
    this env's generator. Each reset builds a new SkyRL env for its row; after ``done``, ``step``
    raises :class:`~agentenv.errors.ResetNeeded`.

    Args:
        skyrl_id: SkyRL-gym's id, e.g. ``"gsm8k"``, ``"gsm8k_multi_turn"``, ``"text2sql"``.
        data: The dataset file (``.jsonl`` or ``.parquet``, SkyRL's row layout: module docstring).
        env_config: SkyRL's ``env_config`` for the id (e.g. ``text2sql``'s ``db_file_path``), passed as
            an OmegaConf ``DictConfig`` as SkyRL's trainer does.
        num_tasks: Use the first ``num_tasks`` rows; None: all.

    Raises:
        ConfigError: SkyRL-gym has no ``skyrl_id``, ``data`` is missing or unreadable.
        DataError: A row's ``env_class`` names another env, or its prompt is not system messages then
            one user message.
    """

    observation_space = text_space(1 << 17)
    action_space = text_space(1 << 16)

    def __init__(self, skyrl_id: str, *, data: str | Path | None = None,
                 env_config: Mapping[str, Any] | None = None, num_tasks: int | None = None) -> None:
        registry = skyrl_registry()
        if skyrl_id not in registry:
            raise ConfigError(f"SkyRL-gym has no environment {skyrl_id!r} (its ids: {', '.join(sorted(registry))})")
        if data is None:
            raise ConfigError(f"{PREFIX}{skyrl_id} takes its tasks from a SkyRL dataset file: pass data=PATH "
                              f"(env.kwargs.data=PATH on the command line; .jsonl or .parquet)")
        rows = read_rows(Path(data))[:num_tasks]
        self.skyrl_id, self.data = skyrl_id, Path(data)
        self._config = dict(env_config or {})
        self._rows = [self._checked(row, f"{data} row {i}") for i, row in enumerate(rows)]
        self._tasks = TaskSet(tuple(f"{skyrl_id}/{i}" for i in range(len(rows))),
                              tuple(str(row.get("data_source") or skyrl_id) for row in rows))
        self._env: Any = None
        self._done = True
        self._task_id = ""

    def _checked(self, row: dict[str, Any], where: str) -> dict[str, Any]:
        if ROW_PROMPT not in row:
            raise DataError(f"{where}: no {ROW_PROMPT!r} field (SkyRL's rows have prompt, env_class, reward_spec)")
        if row.get(ROW_ENV) not in (None, self.skyrl_id):
            raise DataError(f"{where}: env_class {row[ROW_ENV]!r} is not {self.skyrl_id!r}")
        split_prompt(row[ROW_PROMPT], where)
        return row

    def tasks(self) -> TaskSet:
        """The rows in order: ids ``"<ID>/<i>"``, kinds each row's ``data_source`` (else the ID)."""
        return self._tasks

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Build SkyRL's env for the task's row and ``init`` it with the row's prompt.

        Returns:
            The prompt's user message and SkyRL's ``init`` metadata plus ``task_id``.

        Raises:
            ClosedError: The env is closed.
            DataError: The task index is out of range.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        await super().reset(seed=seed)
        index = (options or {}).get("task")
        if index is None:
            index = int(self.np_random.integers(len(self._rows)))
        elif not 0 <= int(index) < len(self._rows):
            raise DataError(f"{PREFIX}{self.skyrl_id}: task index {index} out of range [0, {len(self._rows)})")
        row = self._rows[int(index)]
        self._close_episode()
        self._env = self._make(row)
        conversation, metadata = self._env.init(_plain(row[ROW_PROMPT]))
        self.system_prompt, user = split_prompt(conversation, f"{self!r} init()")
        self._task_id, self._done = self._tasks.ids[int(index)], False
        return user, {**dict(metadata or {}), "task_id": self._task_id}

    def _make(self, row: Mapping[str, Any]) -> Any:
        import skyrl_gym
        from omegaconf import OmegaConf

        extras = {k: v for k, v in row.items() if k not in (ROW_PROMPT, ROW_ENV)}
        return skyrl_gym.make(self.skyrl_id, env_config=OmegaConf.create(self._config), extras=extras)

    async def step(self, action: str) -> StepResult[str]:
        """SkyRL's ``step(action)`` (in a worker thread) as a :class:`StepResult`.

        Returns:
            The observation messages' contents joined by blank lines (``""`` when none), SkyRL's reward,
            ``terminated = done``, ``truncated = False``; ``info``: SkyRL's metadata, ``task_id``, and
            ``postprocessed_action`` and (at the end) ``skyrl_metrics`` where SkyRL gives them.

        Raises:
            ResetNeeded: No episode is running.
        """
        if self._done:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        out = await asyncio.to_thread(self._env.step, action)
        self._done = bool(out["done"])
        info: dict[str, Any] = {**dict(out.get("metadata") or {}), "task_id": self._task_id}
        if out.get("postprocessed_action") is not None:
            info["postprocessed_action"] = out["postprocessed_action"]
        if self._done:
            info["skyrl_metrics"] = self._env.get_metrics()
        text = "\n\n".join(str(m.get("content", "")) for m in out.get("observations") or [])
        return StepResult(text, float(out["reward"]), self._done, False, info)

    def _close_episode(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    async def close(self) -> None:
        """Close the running episode's SkyRL env, then this env."""
        self._close_episode()
        await super().close()

    def __repr__(self) -> str:
        return f"<SkyRLGymEnv {self.skyrl_id}>"


def listed_ids() -> list[str]:
    """SkyRL-gym's registered ids (every one needs a dataset file: ``data=``)."""
    return sorted(skyrl_registry())


def needs(skyrl_id: str) -> tuple[str, ...]:
    """Nothing found besides the package; the dataset file is a keyword argument, checked when built."""
    return ()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``skyrl_gym/<ID>`` when SkyRL-gym registers ``ID``; None otherwise."""
    skyrl_id = agentenv_id[len(PREFIX):]
    return {"skyrl_id": skyrl_id} if skyrl_id in skyrl_registry() else None
