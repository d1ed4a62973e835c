"""The collector's task stream: which task and group member to play next, and where every task stands.

Tasks are reset seeds drawn in order from ``first_seed``; a task put back (:meth:`TaskStream.requeue`:
rejected by the pool, or in flight when a checkpoint was taken) is played before any fresh one.
Every task is played as a :class:`Group` of ``group_size`` members with the same seed (GRPO's
rollouts per prompt; 1 for FlashREINFORCE). A group is *open* from the moment its first member is
handed out until it is complete or dropped; :meth:`TaskStream.next_job` hands out the pending
members of the oldest open groups first, then opens the next task.

At any moment each task handed out is in exactly one place: open, requeued, or closed (handed on
or dropped, which the collector decides); :meth:`TaskStream.state_dict` records the first two for
a checkpoint.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from agentenv.errors import DataError
from agentenv.trajectory import Trajectory


class Group:
    """The ``size`` rollouts of one task being played: members done, members still to (re)play.

    Attributes:
        key: Unique per group of the stream, in the order groups were opened.
        seed: The task's reset seed.
        play: Earlier groups of the same seed (a requeued task is played again).
        members: Each member's samples once it ended well, else None.
        todo: Members still to play (a failed or interrupted one is put back at the front).
        failures: Failed attempts per member.
        dropped: The task was given up; members still in flight are discarded when they end.
    """

    def __init__(self, key: int, seed: int, size: int, play: int = 0) -> None:
        self.key = key
        self.seed = seed
        self.play = play
        self.members: list[list[Trajectory] | None] = [None] * size
        self.todo: collections.deque[int] = collections.deque(range(size))
        self.failures = [0] * size
        self.dropped = False

    @property
    def complete(self) -> bool:
        """Every member ended well."""
        return all(m is not None for m in self.members)


class TaskStream:
    """The order tasks are played in, the open groups and the requeue.

    Args:
        first_seed: Seed of the first fresh task; fresh task ``k`` has seed ``first_seed + k``.
        group_size: Members per group (``>= 1``).
    """

    def __init__(self, first_seed: int, group_size: int) -> None:
        self.next_seed = first_seed
        """Seed of the next fresh task (saved in checkpoints)."""
        self._group_size = group_size
        self._requeued: collections.deque[int] = collections.deque()  # seeds
        self._plays: collections.Counter[int] = collections.Counter()  # groups opened per seed
        self._open: list[Group] = []  # oldest first
        self._keys = 0

    @property
    def open_groups(self) -> Sequence[Group]:
        """The groups being played, oldest first."""
        return tuple(self._open)

    @property
    def requeued(self) -> list[int]:
        """Seeds waiting in the requeue, in the order they will be played."""
        return list(self._requeued)

    def requeue(self, seed: int) -> None:
        """Play the task of ``seed`` anew, before any fresh task (after those requeued earlier)."""
        self._requeued.append(seed)

    def next_job(self, max_groups: int | None = None) -> tuple[Group, int] | None:
        """The next ``(group, member)`` to play: a pending member of an open group, else a new group.

        Args:
            max_groups: Play only the oldest that many open groups, opening a new one only while
                fewer are open (None: no limit).

        Returns:
            The job; None when ``max_groups`` groups are open and none has a pending member.
        """
        groups = self._open if max_groups is None else self._open[:max_groups]
        for group in groups:
            if group.todo:
                return group, group.todo.popleft()
        if max_groups is not None and len(self._open) >= max_groups:
            return None
        if self._requeued:
            seed = self._requeued.popleft()
        else:
            seed, self.next_seed = self.next_seed, self.next_seed + 1
        group = Group(self._keys, seed, self._group_size, self._plays[seed])
        self._plays[seed] += 1
        self._keys += 1
        self._open.append(group)
        return group, group.todo.popleft()

    def close(self, group: Group) -> None:
        """``group`` is no longer open (complete and handed on, or dropped); closing twice is harmless."""
        if group in self._open:
            self._open.remove(group)

    def state_dict(self) -> dict[str, Any]:
        """Where the stream stands, for a checkpoint (JSON-serialisable).

        Keys: ``next_seed`` (the next fresh task), ``in_flight`` (seeds of the open groups, oldest
        first, their members done or not) and ``requeued`` (seeds waiting in the requeue, in order).
        """
        return {"next_seed": self.next_seed, "in_flight": [g.seed for g in self._open], "requeued": self.requeued}

    def load_state_dict(self, state: dict[str, Any]) -> list[int]:
        """Continue the stream of a :meth:`state_dict`: its in-flight tasks first, then its requeued ones.

        Each is played anew from its start. A state with only ``next_seed`` requeues nothing.

        Returns:
            The seeds of the in-flight tasks requeued.

        Raises:
            DataError: A key is missing or a seed is not an integer; the stream is unchanged.
        """
        try:
            next_seed = int(state["next_seed"])
            in_flight = [int(s) for s in state.get("in_flight", [])]
            requeued = [int(s) for s in state.get("requeued", [])]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"bad collector state: {e!r}") from e
        self.next_seed = next_seed
        self._requeued = collections.deque(in_flight + requeued)
        return in_flight
