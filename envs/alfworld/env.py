"""The ``alfworld`` environment: one ALFWorld household game per episode.

The observation is the game's text (room description and ``Your task is to: ...`` goal on reset,
feedback after each command), followed by the admissible commands unless ``show_admissible=False``.
The action is the model's reply; :func:`~agentenv.envs.alfworld.commands.parse_command` extracts one
command from it, and a command the game does not accept gets the game's own "Nothing happens."
feedback. Reward 1.0 on the step that wins the game (``infos["won"]``, as in ALFWorld, Shridhar et
al., ICLR 2021), else 0.0; the episode is truncated after ``max_steps`` commands (50 in the papers).

TextWorld calls block (a reset takes about a second), so they run in a small shared thread pool and
never block the event loop; each environment holds at most one live game, so the number of live
games is the number of environments the caller keeps.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, ClassVar, TypeVar

from agentenv.core import Env, StepResult, TaskSet
from agentenv.envs.alfworld.commands import parse_command
from agentenv.envs.alfworld.game import GameState, TextWorldGame
from agentenv.envs.alfworld.games import GameRef, canonical_split, list_games, read_game
from agentenv.errors import ClosedError, ConfigError, DataError, ResetNeeded

T = TypeVar("T")

#: Threads of the shared pool that runs TextWorld calls (one call per environment at a time).
DEFAULT_THREADS = 8
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def shared_executor() -> ThreadPoolExecutor:
    """The process-wide thread pool for blocking game calls (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=DEFAULT_THREADS, thread_name_prefix="alfworld")
        return _pool


_listing_lock = threading.Lock()


@functools.lru_cache(maxsize=8)
def _listed(split: str, data_root: str | None) -> tuple[GameRef, ...]:
    return tuple(list_games(split, data_root))


def cached_games(split: str, data_root: str | None = None) -> list[GameRef]:
    """:func:`~agentenv.envs.alfworld.games.list_games`, listed once per process and ``(split, data_root)``.

    Many environments of one split (a training run builds ``run.concurrency`` of them) share one
    listing, made by the first caller while the others wait; a failed listing is not cached.

    Raises:
        DataError: See :func:`~agentenv.envs.alfworld.games.list_games`.
    """
    with _listing_lock:
        return list(_listed(canonical_split(split), data_root))


SYSTEM_PROMPT = (
    "You are an agent in a household. Each turn, reply with exactly one command from the admissible "
    "commands (for example: go to desk 1), and nothing else."
)


def require_alfworld() -> None:
    """Check that the game engine can be imported (it is an optional install).

    Raises:
        ConfigError: ``alfworld`` or ``textworld`` is missing; the message says how to install them.
    """
    missing = [name for name in ("textworld", "alfworld") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"the ALFWorld environment needs {' and '.join(missing)}, which are not installed: "
            "run `bash scripts/install_alfworld.sh` (uses .venv/bin/pip; PIP=... to choose another)"
        )


class AlfWorldEnv(Env[str, str]):
    """One ALFWorld TextWorld game per episode.

    Args:
        split: ``valid_seen`` (140 games), ``valid_unseen`` (134) or ``train`` (3553, extracted once
            into the cache).
        max_steps: Commands per episode before truncation (steps).
        data_root: The ``alfworld`` data folder (default ``<data_dir>/alfworld``).
        show_admissible: Append the admissible commands to each observation.
        games: Play these games instead of listing ``split`` (tests, subsets).
        executor: Runs the blocking game calls (default: :func:`shared_executor`).

    ``reset(seed=s)`` picks a game with the environment's generator (the same seed gives the same
    game); ``reset(options={"task": i})`` plays game ``i`` of the sorted split (:meth:`tasks`: ids
    ``"<split>/<game name>"``, kinds the task types); ``options={"game": g}`` does the same with an
    int index or a game name. ``info`` holds ``task_type``, ``game``, ``game_index``, ``task_id``,
    ``game_file``, ``steps``, ``won``, ``admissible_commands`` and, after a step, ``command`` (what
    was parsed).

    Raises:
        DataError: (constructor) unknown split; (reset) missing split folder, missing or corrupt
            game file, unknown game name or index.
        ConfigError: (constructor) ``max_steps < 1``, or the ``alfworld``/``textworld`` packages are not
            installed (the message names ``scripts/install_alfworld.sh``).
    """

    system_prompt = SYSTEM_PROMPT
    cut_turn = "act"  # a reply cut by the token budget is still tried as a command: games are played out
    #: Expected seconds of a reset (a game loaded; measured about 1.5 s) and of one command turn (a
    #: short reply generated on a CPU engine and the game's step): the units of the episode deadline.
    expected_reset_s: ClassVar[float] = 2.0
    expected_turn_s: ClassVar[float] = 5.0

    def __init__(
        self,
        split: str = "valid_seen",
        *,
        max_steps: int = 50,
        data_root: str | None = None,
        show_admissible: bool = True,
        games: Sequence[GameRef] | None = None,
        executor: Executor | None = None,
    ) -> None:
        if max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {max_steps}")
        require_alfworld()
        self.split = canonical_split(split)
        self.max_steps = max_steps
        self.data_root = data_root
        self.show_admissible = show_admissible
        self._games: list[GameRef] | None = list(games) if games is not None else None
        self._executor = executor
        self._game: TextWorldGame | None = None
        self._current: GameRef | None = None
        self._loaded: GameRef | None = None
        self._index = -1
        self._steps = 0
        self._admissible: tuple[str, ...] = ()
        self._active = False

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor or shared_executor(), fn, *args)

    async def games(self) -> list[GameRef]:
        """The games this environment draws from (listed on first use, in a worker thread)."""
        if self._games is None:
            self._games = await self._call(cached_games, self.split, self.data_root)
        return self._games

    @property
    def episode_deadline_s(self) -> float:
        """The default episode deadline (seconds): 10x the expected episode time.

        Expected: :attr:`expected_reset_s` + ``max_steps`` x :attr:`expected_turn_s` (252 s for the
        papers' 50 commands; the deadline 2520 s). ``rollout.episode_deadline_s`` overrides it
        (:func:`agentenv.rollout.episode.episode_deadline`).
        """
        return 10 * (self.expected_reset_s + self.max_steps * self.expected_turn_s)

    def tasks(self) -> TaskSet:
        """The games in order: ids ``"<split>/<game name>"`` (as ``info["task_id"]``), kinds the task types.

        Lists the split on first use (:func:`cached_games`; the train split is extracted into the
        cache the first time, a few seconds), in the calling thread.

        Raises:
            DataError: The split cannot be listed.
        """
        if self._games is None:
            self._games = cached_games(self.split, self.data_root)
        return TaskSet(tuple(self._task_id(g) for g in self._games), tuple(g.task_type for g in self._games))

    def _task_id(self, game: GameRef) -> str:
        return f"{self.split}/{game.name}"

    def _pick(self, games: list[GameRef], options: Mapping[str, Any] | None) -> int:
        options = options or {}
        choice = options.get("task", options.get("game"))
        if choice is None:
            return int(self.np_random.integers(len(games)))
        if isinstance(choice, int) and not isinstance(choice, bool):
            if not 0 <= choice < len(games):
                raise DataError(f"game index {choice} is out of range for {len(games)} {self.split} games")
            return choice
        for i, g in enumerate(games):
            if g.name == choice or str(g.path) == str(choice):
                return i
        raise DataError(f"no game {choice!r} in split {self.split}")

    def _start(self, ref: GameRef) -> GameState:
        if self._game is None:
            self._game = TextWorldGame()
        if ref != self._loaded:  # the same game again (K samples) needs no new load
            self._loaded = None
            self._game.load(read_game(ref.path))
            self._loaded = ref
        return self._game.reset()

    def _observation(self, state: GameState) -> str:
        if not self.show_admissible:
            return state.feedback
        return f"{state.feedback}\n\nAdmissible commands: {', '.join(state.admissible_commands)}."

    def _info(self, state: GameState) -> dict[str, Any]:
        assert self._current is not None
        return {
            "task_type": self._current.task_type,
            "game": self._current.name,
            "game_index": self._index,
            "task_id": self._task_id(self._current),
            "game_file": str(self._current.path),
            "steps": self._steps,
            "won": state.won,
            "admissible_commands": list(state.admissible_commands),
        }

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Load a game and return its first observation and info (see the class docstring).

        Raises:
            ClosedError: The environment was closed.
            DataError: The game is missing, corrupt, or not in the split.
        """
        if self._closed:
            raise ClosedError("AlfWorldEnv is closed")
        await super().reset(seed=seed)
        self._active = False
        games = await self.games()
        self._index = self._pick(games, options)
        self._current = games[self._index]
        state = await self._call(self._start, self._current)
        self._steps = 0
        self._admissible = state.admissible_commands
        self._active = True
        return self._observation(state), self._info(state)

    async def step(self, action: str) -> StepResult[str]:
        """Apply the command parsed from ``action`` (any text; never raises for its content).

        Raises:
            ResetNeeded: No episode is running (before ``reset`` or after the episode ended).
        """
        if not self._active or self._game is None:
            raise ResetNeeded("call reset() before step(); the ALFWorld episode is not running")
        command = parse_command(str(action), self._admissible)
        state = await self._call(self._game.step, command)
        self._steps += 1
        self._admissible = state.admissible_commands
        truncated = not state.won and self._steps >= self.max_steps
        if state.won or truncated:
            self._active = False
        info = self._info(state) | {"command": command}
        return StepResult(self._observation(state), 1.0 if state.won else 0.0, state.won, truncated, info)

    async def close(self) -> None:
        """Close the live game, if any. Safe to call more than once."""
        game, self._game = self._game, None
        self._active = False
        self._loaded = None
        await super().close()
        if game is not None:
            await self._call(game.close)

    def __repr__(self) -> str:
        return f"<AlfWorldEnv split={self.split} max_steps={self.max_steps}>"
