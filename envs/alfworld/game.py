"""One blocking TextWorld game, driven with alfworld's ``AlfredDemangler`` and ``AlfredInfos``.

Every method here blocks (a reset parses the game's PDDL and takes about a second); the async
:class:`~agentenv.envs.alfworld.env.AlfWorldEnv` calls them in a worker thread. One
:class:`TextWorldGame` keeps one TextWorld ``PddlEnv`` for its whole life and loads each new game
into it: each ``PddlEnv`` loads its own private copy of fast-downward's shared library (which is
what makes separate games safe to run in separate threads), and that copy is never unloaded, so
reusing the ``PddlEnv`` keeps memory flat across games.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentenv.errors import DataError

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


class TextWorldGame:
    """A blocking ALFWorld game: ``load`` a game's data, then ``reset`` and ``step``.

    Raises:
        DataError: (from :meth:`load`) the game data cannot be parsed by TextWorld.
    """

    def __init__(self) -> None:
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
        from textworld.envs.pddl import PddlEnv

        infos = textworld.EnvInfos(won=True, admissible_commands=True)
        self._env = AlfredInfos(AlfredDemangler(PddlEnv(infos), shuffle=False))
        self._loaded = False

    def load(self, data: dict[str, Any]) -> None:
        """Load a game from its JSON data (see :func:`~agentenv.envs.alfworld.games.read_game`).

        Raises:
            DataError: TextWorld cannot parse the PDDL or the grammar.
        """
        self._loaded = False
        try:
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
            return _state(self._env.reset())
        except Exception as exc:
            raise DataError(f"TextWorld cannot reset the game: {type(exc).__name__}: {exc}") from exc

    def step(self, command: str) -> GameState:
        """Apply one command; an inadmissible one yields the game's "Nothing happens." feedback."""
        raw, _score, _done = self._env.step(command)
        return _state(raw)

    def close(self) -> None:
        """Release the TextWorld environment (its fast-downward library copy stays mapped)."""
        self._env.close()
        self._loaded = False
