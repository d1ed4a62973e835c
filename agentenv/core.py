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
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

import numpy as np
from gymnasium import spaces

ObsT = TypeVar("ObsT")
ActT = TypeVar("ActT")

#: Characters a declared text space holds: printable ASCII plus newline, tab and carriage return.
TEXT_CHARSET = frozenset(chr(c) for c in range(32, 127)) | frozenset("\n\t\r")


class UnicodeText(spaces.Text):
    """``spaces.Text`` whose ``contains`` accepts any Unicode string of length ``[min_length, max_length]``.

    Tool output and math problems hold characters outside printable ASCII (``’``, ``π``, box drawing
    in tracebacks), which Gymnasium's ``Text`` rejects whatever its charset. ``contains`` accepts any
    ``str`` of allowed length without a NUL character; ``sample()`` draws from :data:`TEXT_CHARSET`,
    so it stays cheap and reproducible.

    Args:
        max_length: Longest allowed string, in characters.
        min_length: Shortest allowed string, in characters.
        seed: Seeds ``sample()``.
    """

    def __init__(self, max_length: int = 65_536, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset="".join(sorted(TEXT_CHARSET)), seed=seed)

    def contains(self, x: Any) -> bool:
        """True for a ``str`` of allowed length with no NUL character."""
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length and "\x00" not in x

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, UnicodeText) and (self.min_length, self.max_length) == (
            other.min_length,
            other.max_length,
        )


def text_space(max_length: int = 65_536) -> UnicodeText:
    """The text space of an env's observations or actions: any Unicode string up to ``max_length`` characters.

    Gymnasium's ``Text`` takes only the characters of its charset (letters and digits by default),
    which rejects almost every real observation; this one takes any text without a NUL
    (:class:`UnicodeText`).

    Args:
        max_length: Longest allowed string, in characters.
    """
    return UnicodeText(max_length)


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


@dataclass(frozen=True)
class TaskSet:
    """The tasks an environment instance plays, in a fixed order (see :meth:`Env.tasks`).

    Attributes:
        ids: ``(n,)`` task ids, unique; ``reset(options={"task": i})`` plays ``ids[i]`` and its
            ``info["task_id"]`` is ``ids[i]``.
        kinds: ``(n,)`` each task's family or task type (``""`` when the env has none), used to
            break evaluation reports down per kind.

    Raises:
        ValueError: ``ids`` and ``kinds`` differ in length, or an id repeats.
    """

    ids: tuple[str, ...]
    kinds: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.kinds):
            raise ValueError(f"TaskSet: {len(self.ids)} ids but {len(self.kinds)} kinds")
        if len(set(self.ids)) != len(self.ids):
            raise ValueError("TaskSet: task ids must be unique")

    def __len__(self) -> int:
        return len(self.ids)

    def first(self, n: int) -> TaskSet:
        """The first ``n`` tasks (all of them when ``n >= len(self)``), in order."""
        return TaskSet(self.ids[:n], self.kinds[:n])


@dataclass(frozen=True)
class Demonstration:
    """One scripted episode for the supervised warm-up, as chat messages; the trainer renders the tokens.

    Attributes:
        messages: The episode after the system prompt, in order: the task (``{"role": "user",
            "content": text}``), then the assistant's replies and the env's observations. A reply is
            ``{"role": "assistant", "content": text}`` or, when it calls tools, ``{"role":
            "assistant", "tool_calls": [{"type": "function", "function": {"name": ..., "arguments":
            {...}}}, ...]}`` (arguments a mapping, as chat templates take them); an observation has
            the env's :attr:`Env.observation_role` and, as ``content``, the text ``step`` would
            return for that reply.
        system: The system prompt the episode is played under (the env's :attr:`Env.system_prompt`).
        tools: The tool schemas advertised (the env's :attr:`Env.tools`).

    Raises:
        ValueError: The first message is not the user's task, or a message after it is neither an
            assistant reply (with ``content`` or ``tool_calls``) nor an observation (a role other than
            ``system``, with str ``content``).
    """

    messages: tuple[Mapping[str, Any], ...]
    system: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.messages or self.messages[0].get("role") != "user" or not isinstance(
                self.messages[0].get("content"), str):
            raise ValueError("Demonstration: the first message must be the task, {'role': 'user', 'content': str}")
        for m in self.messages[1:]:
            if m.get("role") == "assistant":
                if not (isinstance(m.get("content"), str) or m.get("tool_calls")):
                    raise ValueError(f"Demonstration: an assistant message needs content or tool_calls: {m!r}")
            elif m.get("role") in (None, "system") or not isinstance(m.get("content"), str):
                raise ValueError(f"Demonstration: an observation needs the env's role and str content: {m!r}")


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
        demonstrations_tag: Names this env's :meth:`scripted_demonstrations` in the warm-up's cache
            key; None (default) uses the class's qualified name, ``""`` adds nothing to the key.
        episode_deadline_s: The env's default wall-clock budget of one episode (seconds: reset,
            generation and steps), a stated multiple of its expected episode time; None (default): no
            deadline. ``rollout.episode_deadline_s`` overrides it (may be a property).
        timing_info_keys: Keys of ``info`` that hold wall-clock timings (seconds), which vary from
            run to run: the Gymnasium adapter moves them out of ``info`` and the determinism checker
            ignores them.
        split: The name of the task split this instance plays (for example ``"valid_seen"``), copied
            into evaluation reports; ``""`` (default): unnamed.

    Optional hooks: :meth:`tasks` (a fixed task list, for held-out evaluation) and
    :meth:`scripted_demonstrations` (transcripts for the supervised warm-up).
    """

    observation_role: ClassVar[str] = "user"
    cut_turn: ClassVar[str] = "end"
    tools: Sequence[Mapping[str, Any]] = ()
    system_prompt: str | None = None
    observation_space: spaces.Space = text_space()
    action_space: spaces.Space = text_space()
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}
    demonstrations_tag: ClassVar[str | None] = None
    episode_deadline_s: float | None = None
    timing_info_keys: tuple[str, ...] = ()
    split: str = ""

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

    def tasks(self) -> TaskSet | None:
        """The tasks this instance plays, in a fixed order; None (default): tasks come from the seed only.

        An env that returns a :class:`TaskSet` plays task ``i`` on ``reset(options={"task": i})``
        (``i`` an int index into ``ids``) and puts its id in ``info["task_id"]``. Held-out
        evaluation (``agentenv train`` with ``eval.problems > 0``, ``agentenv eval``) needs it.

        Raises:
            DataError: The env's task data cannot be read.
        """
        return None

    @classmethod
    def scripted_demonstrations(cls, *, count: int, seed: int) -> list[Demonstration]:
        """Scripted episodes for the supervised warm-up (``warmup.steps > 0``), as chat messages.

        Override in envs whose tool or answer format a small model must first be shown; the default
        has none (see :func:`has_scripted_demonstrations`). The trainer renders each one with the
        policy's chat template, laid out as a rollout of the same replies would be, and writes each
        tool call in the syntax of the template's tool-call family
        (:func:`agentenv.trainer.demonstrations.render_demonstration`).

        Args:
            count: Demonstrations to write.
            seed: Seeds what the demonstrations are about; the same seed gives the same episodes.

        Returns:
            ``count`` demonstrations.

        Raises:
            NotImplementedError: The env has no scripted demonstrations.
        """
        raise NotImplementedError(f"{cls.__name__} has no scripted demonstrations")

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


def has_scripted_demonstrations(entry: object) -> bool:
    """Whether ``entry`` (a registry entry point) is an Env class that overrides :meth:`Env.scripted_demonstrations`.

    An entry point that is a factory function has none: the hook is a classmethod of the Env class.
    """
    return (isinstance(entry, type) and issubclass(entry, Env)
            and entry.scripted_demonstrations.__func__ is not Env.scripted_demonstrations.__func__)
