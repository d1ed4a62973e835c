"""``gem/<ID>``: GEM's environments (PyPI ``gem-llm``), e.g. ``gem/game:GuessTheNumber-v0``.

GEM's ``Env`` is synchronous, Gymnasium-like: ``reset(seed) -> (observation, info)`` and
``step(action) -> (observation, reward, terminated, truncated, info)``. The adapter passes all five
through unchanged (reward as float, flags as bool); GEM's ``info`` (e.g. its ``suffix``) stays in
``info``. GEM's games draw from the global ``random`` module and GEM seeds only its own
``_np_random``; the adapter gives each environment a private ``random`` stream seeded from the
episode's seed (:class:`~agentenv.adapters._common.PrivateRandom`), so a seeded episode repeats and
the process's global ``random`` is untouched.

``agentenv envs`` lists GEM's self-contained ``game:`` ids; every other GEM id can be made too, but
its data (``math:``, ``qa:``, ``code:``) comes from the Hugging Face hub, out of reach offline. The
games that download NLTK data on first use (Hangman, Wordle) need it installed beforehand: ``agentenv
envs`` marks them when it is not, and building one then raises :class:`~agentenv.errors.EnvUnavailable`
before any of GEM's game code runs (:func:`needs`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentenv.adapters._common import PrivateRandom, SeedTasks, root_logging_kept
from agentenv.adapters.needs import source_needs, unavailable_reason
from agentenv.core import Env, StepResult, TaskSet, text_space
from agentenv.errors import ClosedError, ConfigError, EnvUnavailable, ResetNeeded

PREFIX = "gem/"


def gem_registry() -> dict[str, Any]:
    """GEM's registry (``gem.envs.registration.ENV_REGISTRY``), imported without ``import gem``'s logging setup."""
    with root_logging_kept():
        import gem  # noqa: F401  (its __init__ calls logging.basicConfig)
        from gem.envs.registration import ENV_REGISTRY
    return ENV_REGISTRY


class GemEnv(Env[str, str]):
    """A GEM environment behind agentenv's asynchronous contract.

    Tasks: task ``i`` is the episode GEM deals for seed ``task_seed + i`` (ids ``"<GEM id>/<seed>"``);
    ``reset(options={"task": i})`` plays it, ``reset(seed=s)`` without a task plays one drawn from
    this env's generator. After ``terminated or truncated``, ``step`` raises
    :class:`~agentenv.errors.ResetNeeded`.

    Args:
        gem_id: GEM's id, e.g. ``"game:GuessTheNumber-v0"``.
        task_seed: GEM seed of task 0.
        num_tasks: Tasks (seeds) in :meth:`tasks`, >= 1.
        **gem_kwargs: Keyword arguments of ``gem.make`` (the game's own, e.g. ``max_turns``).

    Raises:
        ConfigError: GEM has no ``gem_id``, or its constructor rejects ``gem_kwargs``.
        EnvUnavailable: The game cannot be built here (:func:`needs`: NLTK data not installed); raised
            before GEM builds it, the message names what is missing and how to install it.
    """

    observation_space = text_space(1 << 17)
    action_space = text_space(1 << 16)
    cut_turn = "act"
    """A game's reply cut by the token budget is still played as the move; GEM's single-answer tasks
    (ids not starting with ``game:``) set ``"end"`` on the instance: a cut answer is never graded."""

    def __init__(self, gem_id: str, *, task_seed: int = 0, num_tasks: int = 1000, **gem_kwargs: Any) -> None:
        registry = gem_registry()
        if gem_id not in registry:
            raise ConfigError(f"GEM has no environment {gem_id!r} (gem-llm's ids: {', '.join(sorted(registry))})")
        if reason := unavailable_reason(needs(gem_id)):
            raise EnvUnavailable(f"{PREFIX}{gem_id} cannot be built here: {reason}")
        import gem

        self.gem_id = gem_id
        if not gem_id.startswith("game:"):
            self.cut_turn = "end"  # type: ignore[misc]
        self.seeds = SeedTasks(gem_id, task_seed, num_tasks)
        self._random = PrivateRandom()
        try:
            with self._random.active():  # some GEM games reset (and draw) in their constructor
                self.gem_env = gem.make(gem_id, **gem_kwargs)
        except TypeError as exc:
            raise ConfigError(f"gem.make({gem_id!r}, ...) rejected the keyword arguments: {exc}") from exc
        self._done = True
        self._task_id = ""

    def tasks(self) -> TaskSet:
        """Seeds ``task_seed .. task_seed + num_tasks - 1``: ids ``"<GEM id>/<seed>"``, kinds the GEM id."""
        return self.seeds.task_set()

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``gem_env.reset(seed=task seed)``, with the private ``random`` stream seeded the same.

        Returns:
            GEM's observation and its ``info`` plus ``task_id``.

        Raises:
            ClosedError: The env is closed.
            DataError: The task index is out of range.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        await super().reset(seed=seed)
        task_seed, self._task_id = self.seeds.pick(options, self.np_random)
        self._random.seed(task_seed)
        with self._random.active():
            obs, info = self.gem_env.reset(seed=task_seed)
        self._done = False
        return obs, {**info, "task_id": self._task_id}

    async def step(self, action: str) -> StepResult[str]:
        """``gem_env.step(action)``: GEM's 5-tuple as a :class:`StepResult`, ``task_id`` added to ``info``.

        Raises:
            ResetNeeded: No episode is running.
        """
        if self._done:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        with self._random.active():
            obs, reward, terminated, truncated, info = self.gem_env.step(action)
        self._done = bool(terminated or truncated)
        return StepResult(obs, float(reward), bool(terminated), bool(truncated), {**info, "task_id": self._task_id})

    def __repr__(self) -> str:
        return f"<GemEnv {self.gem_id}>"


def listed_ids() -> list[str]:
    """The GEM ids ``agentenv envs`` lists: the self-contained games (``game:``)."""
    return sorted(i for i in gem_registry() if i.startswith("game:"))


def needs(gem_id: str) -> tuple[str, ...]:
    """What GEM's ``gem_id`` needs besides the package (:mod:`agentenv.adapters.needs`), from its source.

    Raises:
        KeyError: GEM has no ``gem_id``.
    """
    entry_point = gem_registry()[gem_id].entry_point
    return source_needs(entry_point.partition(":")[0]) if isinstance(entry_point, str) else ()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``gem/<ID>`` when GEM registers ``ID``; None otherwise."""
    gem_id = agentenv_id[len(PREFIX):]
    return {"gem_id": gem_id} if gem_id in gem_registry() else None
