"""``textarena/<ID>``: TextArena's single-player games (PyPI ``textarena``), e.g. ``textarena/GuessTheNumber-v0``.

TextArena's protocol: ``env.reset(num_players=1, seed=s)``; ``player_id, observation =
env.get_observation()``; ``done, step_info = env.step(action)``; at the end ``rewards, game_info =
env.close()``. The game is built with ``textarena.make(ID)``, its registered wrappers included
(``LLMObservationWrapper`` renders the history as ``[GAME] ...`` / ``[Player] ...`` lines,
``ActionFormattingWrapper`` adds ``[...]`` around an action that has none). The mapping:

- ``reset`` observation: TextArena's first observation (the game prompt).
- ``step`` observation: what TextArena's observation adds since the previous one (its wrappers
  render the whole history each turn; the chat already holds the earlier part). An observation
  that does not extend the previous one (a board redrawn) is passed whole. A ``-raw`` id (no
  wrappers) gives the new messages, rendered as ``LLMObservationWrapper`` renders them.
- reward: 0.0 on every step before the end, then player 0's reward from ``env.close()`` (TextArena
  pays only at the end: 1 for a win, a game's partial score, or its invalid-move penalty).
- ``terminated``: TextArena's ``done``; ``truncated`` is always False (a game's own turn limit is
  one of its rules, and the game scores it).
- ``info``: TextArena's ``step_info``; at the end also ``game_info`` (``reason``, ``invalid_move``,
  ``turn_count``); always ``task_id``.

TextArena's games draw from the global ``random`` module (``State`` calls ``random.seed``); each
adapter env keeps a private stream (:class:`~agentenv.adapters._common.PrivateRandom`).

Games that download NLTK data on first use (Wordle, Hangman, ...) need it installed beforehand, and
games whose game master is an online model (GuessWho, TwentyQuestions) need ``OPENROUTER_API_KEY``
and the network: :func:`needs` reads what a game needs from its source, ``agentenv envs`` marks the
games that cannot be built here, and building one raises :class:`~agentenv.errors.EnvUnavailable`
before any of the game's code runs (so nothing is downloaded).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentenv.adapters._common import PrivateRandom, SeedTasks
from agentenv.adapters.needs import source_needs, unavailable_reason
from agentenv.core import Env, StepResult, TaskSet, text_space
from agentenv.errors import ClosedError, ConfigError, EnvUnavailable, ResetNeeded

PREFIX = "textarena/"


def textarena_registry() -> dict[str, Any]:
    """TextArena's registry (``textarena.envs.registration.ENV_REGISTRY``)."""
    from textarena.envs.registration import ENV_REGISTRY

    return ENV_REGISTRY


def is_single_player(ta_id: str) -> bool:
    """Whether TextArena's ``ta_id`` is a single-player game: its module builds a ``SinglePlayerState``.

    Read from the module's source file without importing it (importing some games downloads data,
    one does not even compile).
    """
    spec = textarena_registry().get(ta_id)
    if spec is None or not isinstance(spec.entry_point, str):
        return False
    import textarena

    module = spec.entry_point.partition(":")[0].split(".")
    path = Path(textarena.__file__).parent.joinpath(*module[1:]).with_suffix(".py")
    try:
        return "SinglePlayerState" in path.read_text(encoding="utf-8")
    except OSError:
        return False


class TextArenaEnv(Env[str, str]):
    """A single-player TextArena game behind agentenv's asynchronous contract (mapping: module docstring).

    Each ``reset`` builds the game afresh with ``textarena.make`` (:attr:`ta_env`), as TextArena's
    own play loops do.

    Tasks: task ``i`` is the game TextArena deals for seed ``task_seed + i`` (ids ``"<ID>/<seed>"``);
    ``reset(options={"task": i})`` plays it, ``reset(seed=s)`` without a task plays one drawn from
    this env's generator. After the game ends, ``step`` raises :class:`~agentenv.errors.ResetNeeded`.

    Args:
        ta_id: TextArena's id, e.g. ``"GuessTheNumber-v0"``.
        task_seed: TextArena seed of task 0.
        num_tasks: Tasks (seeds) in :meth:`tasks`, >= 1.
        **ta_kwargs: Keyword arguments of ``textarena.make`` (the game's own, e.g. ``max_turns``).

    Raises:
        ConfigError: TextArena has no ``ta_id``, it is not a single-player game, or the game's
            constructor rejects ``ta_kwargs``.
        EnvUnavailable: The game cannot be built here (:func:`needs`: NLTK data not installed,
            ``OPENROUTER_API_KEY`` not set, a module that does not compile); raised before the game's
            code runs, the message names what is missing and how to install it.
    """

    observation_space = text_space(1 << 17)
    action_space = text_space(1 << 16)
    cut_turn = "act"
    """Games: a reply cut by the token budget is still played as the move, and the game goes on."""

    def __init__(self, ta_id: str, *, task_seed: int = 0, num_tasks: int = 1000, **ta_kwargs: Any) -> None:
        import textarena

        if ta_id not in textarena_registry():
            raise ConfigError(f"TextArena has no environment {ta_id!r}")
        if not is_single_player(ta_id):
            raise ConfigError(f"textarena/{ta_id} is not a single-player game (agentenv plays one player)")
        if reason := unavailable_reason(needs(ta_id)):
            raise EnvUnavailable(f"{PREFIX}{ta_id} cannot be built here: {reason}")
        self.ta_id = ta_id
        self.seeds = SeedTasks(ta_id, task_seed, num_tasks)
        self._random = PrivateRandom()
        self._make = lambda: textarena.make(ta_id, **ta_kwargs)
        try:
            with self._random.active():
                self.ta_env = self._make()
        except TypeError as exc:
            raise ConfigError(f"textarena.make({ta_id!r}, ...) rejected the keyword arguments: {exc}") from exc
        self._done = True
        self._last = ""
        self._task_id = ""

    def tasks(self) -> TaskSet:
        """Seeds ``task_seed .. task_seed + num_tasks - 1``: ids ``"<ID>/<seed>"``, kinds the TextArena id."""
        return self.seeds.task_set()

    def _observe(self) -> str:
        _, obs = self.ta_env.get_observation()
        if not isinstance(obs, str):  # a "-raw" id: the new (sender, message, type) triples, unrendered
            roles = self.ta_env.state.role_mapping
            return "\n".join(f"[{roles.get(sender, f'Player {sender}')}] {message}" for sender, message, _ in obs)
        new = obs[len(self._last):] if obs.startswith(self._last) else obs
        self._last = obs
        return new.lstrip("\n")

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``ta_env.reset(num_players=1, seed=task seed)`` and its first observation.

        Returns:
            The game prompt and ``info`` with ``task_id``.

        Raises:
            ClosedError: The env is closed.
            DataError: The task index is out of range.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        await super().reset(seed=seed)
        task_seed, self._task_id = self.seeds.pick(options, self.np_random)
        self._random.seed(task_seed)
        self._last = ""
        with self._random.active():
            # A fresh game each episode, as TextArena's own loops do: its observation wrappers keep
            # the history across reset() (a second episode's prompt would follow the first's).
            self.ta_env = self._make()
            self.ta_env.reset(num_players=1, seed=task_seed)
            obs = self._observe()
        self._done = False
        return obs, {"task_id": self._task_id}

    async def step(self, action: str) -> StepResult[str]:
        """``ta_env.step(action)``; at the end, the reward of ``ta_env.close()`` (see the module docstring).

        Raises:
            ResetNeeded: No episode is running.
        """
        if self._done:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        with self._random.active():
            done, step_info = self.ta_env.step(action)
            obs = self._observe()
            info: dict[str, Any] = {**(step_info or {}), "task_id": self._task_id}
            reward = 0.0
            if done:
                rewards, game_info = self.ta_env.close()
                reward = float((rewards or {}).get(0, 0.0))
                info["game_info"] = dict(game_info.get(0, {}))
        self._done = bool(done)
        return StepResult(obs, reward, bool(done), False, info)

    def __repr__(self) -> str:
        return f"<TextArenaEnv {self.ta_id}>"


def listed_ids() -> list[str]:
    """The TextArena ids ``agentenv envs`` lists: its single-player games."""
    return sorted(i for i in textarena_registry() if is_single_player(i))


def needs(ta_id: str) -> tuple[str, ...]:
    """What TextArena's game ``ta_id`` needs besides the package (:mod:`agentenv.adapters.needs`), from its source.

    Raises:
        KeyError: TextArena has no ``ta_id``.
    """
    entry_point = textarena_registry()[ta_id].entry_point
    return source_needs(entry_point.partition(":")[0]) if isinstance(entry_point, str) else ()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``textarena/<ID>`` of a single-player game; None otherwise."""
    ta_id = agentenv_id[len(PREFIX):]
    return {"ta_id": ta_id} if is_single_player(ta_id) else None
