"""What the adapters share: seed-numbered task sets and a private stream for peers using global ``random``."""

from __future__ import annotations

import contextlib
import logging
import random
from collections.abc import Iterator, Mapping
from typing import Any

from agentenv.core import TaskSet
from agentenv.errors import ConfigError, DataError


class PrivateRandom:
    """A private stream of Python's ``random`` for a peer that draws from the module's global generator.

    GEM and TextArena call ``random.randint`` and ``random.seed`` on the global generator. Around
    each call into the peer, :meth:`active` swaps the global state for this environment's own one
    and back, so a seeded episode is reproducible whatever else runs in the process, and the global
    stream of the rest of the process is left exactly as it was (the peer's draws never show in
    it). The swap is only safe for calls made on one thread: the adapters call such peers inline on
    the event loop's thread, never from a worker thread.
    """

    def __init__(self) -> None:
        self._state = random.Random().getstate()

    def seed(self, seed: int) -> None:
        """Restart the private stream from ``seed`` (``random.Random(seed)``'s state)."""
        self._state = random.Random(seed).getstate()

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Within the block the global ``random`` is this private stream; afterwards it is restored."""
        saved = random.getstate()
        random.setstate(self._state)
        try:
            yield
        finally:
            self._state = random.getstate()
            random.setstate(saved)


class SeedTasks:
    """Tasks of a seeded peer game: task ``i`` is the game the peer deals for seed ``first_seed + i``.

    Args:
        name: The peer's id of the game; task ids are ``"<name>/<seed>"`` and every kind is ``name``.
        first_seed: Peer seed of task 0.
        count: Number of tasks, >= 1.

    Raises:
        ConfigError: ``count < 1`` or ``first_seed < 0``.
    """

    def __init__(self, name: str, first_seed: int, count: int) -> None:
        if count < 1 or first_seed < 0:
            raise ConfigError(f"{name}: num_tasks must be >= 1 and task_seed >= 0, got {count} and {first_seed}")
        self.name, self.first_seed, self.count = name, int(first_seed), int(count)
        self._set: TaskSet | None = None

    def task_set(self) -> TaskSet:
        """The tasks in order: ids ``"<name>/<seed>"``, each of kind ``name``."""
        if self._set is None:
            seeds = range(self.first_seed, self.first_seed + self.count)
            self._set = TaskSet(tuple(f"{self.name}/{s}" for s in seeds), (self.name,) * self.count)
        return self._set

    def pick(self, options: Mapping[str, Any] | None, rng: Any) -> tuple[int, str]:
        """``(peer seed, task id)`` of the task ``options["task"]`` names, or of one drawn from ``rng``.

        Raises:
            DataError: The task index is outside ``[0, count)``.
        """
        index = (options or {}).get("task")
        if index is None:
            index = int(rng.integers(self.count))
        elif not 0 <= int(index) < self.count:
            raise DataError(f"{self.name}: task index {index} out of range [0, {self.count})")
        seed = self.first_seed + int(index)
        return seed, f"{self.name}/{seed}"


@contextlib.contextmanager
def root_logging_kept() -> Iterator[None]:
    """Undo what an import does to the root logger (GEM's ``import gem`` calls ``logging.basicConfig``)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
