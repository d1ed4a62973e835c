"""One blocking TextWorld game, driven with alfworld's ``AlfredDemangler`` and ``AlfredInfos``.

Every method here blocks (a reset parses the game's PDDL and takes about a second); the async
:class:`~agentenv.envs.alfworld.env.AlfWorldEnv` calls them in a worker thread. One
:class:`TextWorldGame` keeps one TextWorld ``PddlEnv`` for its whole life and loads each new game
into it: each ``PddlEnv`` loads its own private copy of fast-downward's shared library (which is
what makes separate games safe to run in separate threads), and that copy is never unloaded, so
reusing the ``PddlEnv`` keeps memory flat across games.

TextWorld parses PDDL and grammar rules with module-level TatSu parsers that are not thread-safe
(two games loading at once corrupt each other's parse), so every call into TextWorld holds one
process-wide lock: games in threads stay off the event loop but take turns on the CPU (the GIL
allows no more anyway); for CPU parallelism run games in several processes (see ``oracle.py``).
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import Any

from agentenv.errors import DataError

#: Serialises all calls into TextWorld in this process (its parsers are shared module state).
TEXTWORLD_LOCK = threading.Lock()

_BANNER = re.compile(r"^\s*-=\s*Welcome to TextWorld, ALFRED!\s*=-\s*", re.IGNORECASE)


@dataclass(frozen=True)
class GameState:
    """What the game says after a reset or a command.

    Attributes:
        feedback: The game's text (the welcome banner removed).
        admissible_commands: Commands the game accepts now, sorted.
        won: The task's goal holds.
    """

    feedback: str
    admissible_commands: tuple[str, ...]
    won: bool


def _state(raw: Any) -> GameState:
    return GameState(
        feedback=_BANNER.sub("", str(raw["feedback"])).strip(),
        admissible_commands=tuple(raw["admissible_commands"] or ()),
        won=bool(raw["won"]),
    )


def _fast_pddl_env_class() -> type:
    """``PddlEnv`` whose first ``reset`` after ``load`` reuses the initial state ``load`` just built.

    TextWorld's ``PddlEnv.load`` and ``PddlEnv.reset`` each translate the PDDL problem (two
    fast-downward translations apiece, about 0.5 s each), so a load followed by a reset did the work
    twice. The state ``load`` builds is the initial state, so the first reset after a load can start
    from it; the rest of the reset is TextWorld's own code (copied from textworld 1.7's
    ``PddlEnv.reset``). Later resets of the same game build a fresh state as usual.
    """
    from textworld.core import GameState as TWGameState
    from textworld.envs.pddl import PddlEnv

    class FastPddlEnv(PddlEnv):
        _fresh = False

        def load(self, filename_or_data: Any) -> None:
            self._fresh = False
            super().load(filename_or_data)
            self._fresh = True

        def reset(self) -> Any:
            if not self._fresh:
                return super().reset()
            self._fresh = False
            self.prev_state = None
            self.state = TWGameState()
            self._last_action = None
            self._moves = 0
            context = {
                "state": self._pddl_state,
                "facts": list(self._pddl_state.facts),
                "variables": {},
                "mapping": {},
                "entity_infos": self._entity_infos,
            }
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

        def step(self, command: str) -> Any:
            self._fresh = False
            return super().step(command)

    return FastPddlEnv


class TextWorldGame:
    """A blocking ALFWorld game: ``load`` a game's data, then ``reset`` and ``step``.

    Raises:
        DataError: (from :meth:`load`) the game data cannot be parsed by TextWorld.
    """

    def __init__(self) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        with TEXTWORLD_LOCK:
            self._env = AlfredInfos(AlfredDemangler(_fast_pddl_env_class()(infos), shuffle=False))
        self._loaded = False

    def load(self, data: dict[str, Any]) -> None:
        """Load a game from its JSON data (see :func:`~agentenv.envs.alfworld.games.read_game`).

        Raises:
            DataError: TextWorld cannot parse the PDDL or the grammar.
        """
        self._loaded = False
        try:
            with TEXTWORLD_LOCK:
                self._env.load(data)
        except Exception as exc:  # TextWorld raises assorted parser errors for a corrupt game
            raise DataError(f"TextWorld cannot load the game: {type(exc).__name__}: {exc}") from exc
        self._loaded = True

    def reset(self) -> GameState:
        """Start the loaded game from its initial state.

        Raises:
            DataError: No game loaded, or the game's initial state cannot be built.
        """
        if not self._loaded:
            raise DataError("no ALFWorld game is loaded")
        try:
            with TEXTWORLD_LOCK:
                return _state(self._env.reset())
        except Exception as exc:
            raise DataError(f"TextWorld cannot reset the game: {type(exc).__name__}: {exc}") from exc

    def step(self, command: str) -> GameState:
        """Apply one command; an inadmissible one yields the game's "Nothing happens." feedback."""
        with TEXTWORLD_LOCK:
            raw, _score, _done = self._env.step(command)
            return _state(raw)

    def close(self) -> None:
        """Release the TextWorld environment (its fast-downward library copy stays mapped)."""
        with TEXTWORLD_LOCK:
            self._env.close()
        self._loaded = False
