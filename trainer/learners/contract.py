"""The learner contract: what the training loop asks of every learner backend.

:class:`PolicyLearner` is met by the single-process :class:`agentenv.trainer.learners.single.Learner`, the
DeepSpeed :class:`agentenv.trainer.learners.openrlhf.OpenRLHFLearner` and the Ray
:class:`agentenv.trainer.learners.ray_group.RayLearnerGroup`. All three run the same micro-step
(:func:`agentenv.trainer.learners.update_step.micro_batch_objective`) and report :class:`UpdateStats`.
``tests/trainer/test_learner_contract.py`` checks each backend's members and signatures against it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from agentenv.trainer.checkpoint import LoadedCheckpoint
    from agentenv.trainer.learners.update_step import UpdateStats
    from agentenv.trajectory import Trajectory

__all__ = ["PolicyLearner"]


@runtime_checkable
class PolicyLearner(Protocol):
    """A policy under training: scores trajectories, takes one optimizer step per batch, checkpoints.

    ``version`` counts optimizer steps, those before a resume included.
    """

    @property
    def version(self) -> int:
        """The policy version (optimizer steps taken)."""
        ...

    def score(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current log pi at each trajectory's policy tokens (one ``(T_i,)`` float32 tensor each, nats), no gradient."""
        ...

    def entropy(self, trajectories: Sequence[Trajectory]) -> float:
        """Mean entropy of pi at each trajectory's policy tokens (nats/token), no gradient."""
        ...

    def update(
        self, trajectories: Sequence[Trajectory], *, scores: Sequence[torch.Tensor] | None = None
    ) -> UpdateStats:
        """One optimizer step on a fresh batch (``version += 1`` when it steps); ``scores``: the gate's q."""
        ...

    def weights_for_engine(self, path: Path | str | None = None) -> dict[str, torch.Tensor] | Path:
        """The full policy weights for a generation engine: a state dict, or a safetensors file at ``path``."""
        ...

    def save(self, root: Path | str, *, pool_state: dict | None = None, extra: dict | None = None,
             keep: int = 2) -> Path:
        """An atomic checkpoint under ``root`` (the newest ``keep`` kept); returns its folder."""
        ...

    def restore(self, path: Path | str) -> LoadedCheckpoint:
        """Load the checkpoint at ``path`` (a folder or a root) into this learner, its version included."""
        ...
