"""One copy of the policy's weights for a learner and an in-process engine.

An engine that decodes in the learner's process (:class:`~agentenv.engines.transformers_engine.TransformersEngine`)
need not hold a copy of the weights: it can decode with the learner's own parameters, read in place.
The learner's forward and backward passes only read them too; what must not overlap a decoding step
is the optimizer step, which writes them. :class:`SharedWeights` is the lock between the two, a
reader-writer lock that favours the writer (the decode thread takes and releases it at every step, and
would otherwise keep a waiting step out for as long as it decodes):

* the engine decodes each step inside :meth:`SharedWeights.reading`, which gives the policy version
  the parameters hold, so every token is recorded with the version that produced it;
* the learner steps inside :meth:`SharedWeights.writing` and advances its version there.

A step waits for at most the decoding step in progress; the next decoding step waits for the whole
optimizer step. The engine's weight updates are then version bumps, not copies: the run's memory
loses one copy of the weights (0.54 GB for a 135M float32 policy) and each update its state-dict copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from agentenv.errors import WeightUpdateError

__all__ = ["SharedWeights", "share_parameters"]


class SharedWeights:
    """The lock between a learner that writes its parameters and an engine that decodes with them.

    Args:
        version: Returns the policy version the parameters hold (the learner's ``version``); read
            inside :meth:`reading`, so never in the middle of a write.
    """

    def __init__(self, version: Callable[[], int]) -> None:
        self._version = version
        self._cond = threading.Condition()
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0

    @property
    def version(self) -> int:
        """The policy version the parameters hold now (outside a write; inside one, before or after it)."""
        return self._version()

    @contextmanager
    def reading(self) -> Iterator[int]:
        """Read the parameters (one decoding step); yields their policy version.

        Waits while a write runs or waits: a waiting writer goes first.
        """
        with self._cond:
            self._cond.wait_for(lambda: not self._writing and not self._writers_waiting)
            self._readers += 1
        try:
            yield self._version()
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextmanager
    def writing(self) -> Iterator[None]:
        """Write the parameters (an optimizer step, a checkpoint restored) and advance the version inside.

        Waits for the reads in progress to end; reads that begin after this call wait for it.
        """
        with self._cond:
            self._writers_waiting += 1
            try:
                self._cond.wait_for(lambda: not self._writing and not self._readers)
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


def share_parameters(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Make ``target``'s parameters ``source``'s own (the same tensors); ``target``'s own are dropped.

    Both models must have the same parameter names (tied names included) and shapes; ``target``
    keeps its own modules, buffers and flags (its ``eval()`` leaves ``source``'s mode alone), and a
    write to a parameter of either is seen by both. Tied parameters stay tied.

    Raises:
        WeightUpdateError: A name missing from either model, or a shape that differs.
    """
    mine = dict(target.named_parameters(remove_duplicate=False))
    theirs = dict(source.named_parameters(remove_duplicate=False))
    if set(mine) != set(theirs):
        odd = sorted(set(mine) ^ set(theirs))
        raise WeightUpdateError(f"the models' parameter names differ, e.g. {odd[:3]}")
    for name, p in theirs.items():
        if p.shape != mine[name].shape:
            raise WeightUpdateError(f"parameter {name!r} has shape {tuple(p.shape)} against {tuple(mine[name].shape)}")
    for name, p in theirs.items():
        owner, _, attr = name.rpartition(".")
        setattr(target.get_submodule(owner), attr, p)
