"""The environment contract: a small asynchronous twin of ``gymnasium.Env``.

An environment is a text game. ``reset`` returns the first observation (the task, shown to the
model as a user message); each ``step`` takes the model's reply text as the action and returns the
next observation, a reward, and Gymnasium's separate ``terminated`` / ``truncated`` flags
(Gymnasium 0.26 semantics). Tokens never cross this boundary: the rollout loop owns token ids and
renders observations with the model's chat template.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import numpy as np
from gymnasium import spaces

ObsT = TypeVar("ObsT")
ActT = TypeVar("ActT")

#: Characters a declared text space holds: printable ASCII plus newline, tab and carriage return.
TEXT_CHARSET = frozenset(chr(c) for c in range(32, 127)) | frozenset("\n\t\r")


def text_space(max_length: int = 65_536) -> spaces.Text:
    """A Gymnasium ``Text`` space wide enough for real observations (tracebacks, punctuation).

    Gymnasium's default charset is letters and digits only, which rejects almost every real
    observation; this one holds printable ASCII and whitespace.

    Args:
        max_length: Longest allowed string, in characters.
    """
    return spaces.Text(max_length=max_length, min_length=0, charset="".join(sorted(TEXT_CHARSET)))


class StepResult(NamedTuple, Generic[ObsT]):
    """What one ``Env.step`` returns: Gymnasium's 5-tuple with names.

    It is a tuple, so everything Gymnasium users write works: ``obs, reward, terminated, truncated,
    info = await env.step(a)``, ``(await env.step(a))[1]``, ``len(result) == 5``; the fields also
    read by name.

    Attributes:
        observation: The next observation (text for every built-in environment).
        reward: Scalar reward for this step (the built-in environments pay 1.0 on success at the end).
        terminated: The episode reached a terminal state of the task (solved, failed, answered).
        truncated: The episode was cut by a limit outside the task (turns, steps, tokens).
        info: Diagnostics; never needed to play the game (default: an empty read-only mapping).
    """

    observation: ObsT
    reward: float
    terminated: bool
    truncated: bool
    info: Mapping[str, Any] = MappingProxyType({})


class Env(abc.ABC, Generic[ObsT, ActT]):
    """Base class of asynchronous environments.

    Subclasses write ``reset``, ``step`` and, if they hold resources, ``close``. ``reset`` must call
    ``await super().reset(seed=seed)`` first so that :attr:`np_random` is seeded (each environment
    owns its generator; the global ``random`` is never touched).

    Class attributes:
        observation_role: Chat role under which the rollout loop renders ``step`` observations
            (``"tool"`` for tool results, ``"user"`` for game feedback). The ``reset`` observation is
            always a user message.
        tools: JSON schemas (OpenAI/Hermes function format) advertised to the model through the chat
            template; empty for environments without tools.
        system_prompt: Optional system message placed before the first observation.
        cut_turn: What the rollout loop does with a reply cut by the per-turn token budget before its
            end-of-turn token: ``"end"`` ends the episode without stepping (the cut text is never
            graded as a final answer; the episode keeps the reward it has); ``"act"`` closes the turn
            and passes the cut text to ``step`` as the action, and the episode goes on (a game is
            played out). The default ``"end"`` suits graded answers; games choose ``"act"``.
    """

    observation_role: ClassVar[str] = "user"
    cut_turn: ClassVar[str] = "end"
    tools: Sequence[Mapping[str, Any]] = ()
    system_prompt: str | None = None
    observation_space: spaces.Space = text_space()
    action_space: spaces.Space = text_space()
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    _np_random: np.random.Generator | None = None
    _closed: bool = False

    @property
    def np_random(self) -> np.random.Generator:
        """This environment's own random generator, created unseeded on first use."""
        if self._np_random is None:
            self._np_random = np.random.default_rng()
        return self._np_random

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[ObsT, dict[str, Any]]:
        """Start a new episode.

        The base implementation only (re)seeds :attr:`np_random` when ``seed`` is given; subclasses
        call it first, then build the episode and return ``(observation, info)``.

        Args:
            seed: Seeds this environment's generator; the same seed gives the same episode.
            options: Environment-specific choices (e.g. a task index).
        """
        if seed is not None:
            self._np_random = np.random.default_rng(seed)
        return None, {}  # type: ignore[return-value]

    @abc.abstractmethod
    async def step(self, action: ActT) -> StepResult[ObsT]:
        """Apply the model's action and return the next :class:`StepResult`.

        Raises:
            agentenv.errors.ResetNeeded: Called before ``reset`` or after the episode ended.
        """

    async def close(self) -> None:
        """Release resources. Safe to call more than once."""
        self._closed = True

    async def __aenter__(self) -> Env[ObsT, ActT]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__}>"
