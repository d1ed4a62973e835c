"""The DeepSpeed learner as Ray actors: :class:`RayLearnerGroup` (CPU path tested with gloo, GPU path not).

Every actor holds one :class:`agentenv.trainer.learners.openrlhf.OpenRLHFLearner` rank; calls fan out to
all of them (SPMD) and rank 0 answers.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agentenv.engines.sampling import SamplingTransform
from agentenv.trainer.checkpoint import LoadedCheckpoint
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig
from agentenv.trainer.learners.openrlhf import OpenRLHFLearner
from agentenv.trainer.learners.openrlhf_compat import import_openrlhf
from agentenv.trainer.learners.update_step import UpdateStats
from agentenv.trajectory import Trajectory

__all__ = ["RayLearnerGroup"]


class RayLearnerGroup:
    """``world_size`` Ray actors, one per GPU, each an :class:`OpenRLHFLearner` (CPU path tested with gloo).

    The actors use OpenRLHF's ``BaseDistributedActor`` for the rendezvous (MASTER_ADDR/PORT, RANK,
    WORLD_SIZE, LOCAL_RANK from Ray's GPU ids), as OpenRLHF's ``RayActorGroup`` does; rank 0's address
    is handed to the others. Calls fan out to every actor (SPMD) and return rank 0's result. The
    policy version is kept in this process (updated from each update's stats and by :meth:`restore`),
    so reading it never queues behind a running update.

    Args:
        model_factory: Picklable zero-argument callable building the policy inside each actor.
        optim: Optimizer settings.
        backend: DeepSpeed settings.
        world_size: Number of actors (GPUs).
        num_gpus_per_actor: GPUs per actor (1 where the Ray cluster has GPUs; 0 runs the gloo CPU path).
        master_addr: Rendezvous address of rank 0; None takes Ray's node address (OpenRLHF's choice,
            needed across nodes); pass ``"127.0.0.1"`` on a single machine.
        sampling: The rollout's behaviour transform, handed to every actor's learner (None: identity).
        total_steps: The run's optimizer steps, the horizon of a cosine lr schedule.
        loss_constant: ``K`` of ``loss_aggregation: constant`` (as in
            :class:`agentenv.trainer.learners.single.Learner`).
        objective: The loss; execution: the ``learner`` section's micro-batching (as in
            :class:`agentenv.trainer.learners.single.Learner`; None: defaults), handed to every actor.
    """

    def __init__(
        self,
        model_factory: Callable[[], nn.Module],
        optim: OptimConfig,
        backend: OpenRLHFBackendConfig,
        world_size: int,
        num_gpus_per_actor: float = 1.0,
        master_addr: str | None = None,
        sampling: SamplingTransform | None = None,
        total_steps: int | None = None,
        objective: ObjectiveConfig | None = None,
        execution: LearnerConfig | None = None,
        loss_constant: float | None = None,
    ) -> None:
        import ray

        actor_cls = ray.remote(num_gpus=num_gpus_per_actor)(_LearnerActor)
        first = actor_cls.remote(world_size, 0, master_addr, None)
        addr, port = ray.get(first.get_master_addr_port.remote())
        self.actors = [first] + [actor_cls.remote(world_size, r, addr, port) for r in range(1, world_size)]
        ray.get([a.init_learner.remote(model_factory, optim, backend, sampling, total_steps, objective, execution,
                                       loss_constant) for a in self.actors])
        self._version = 0

    def _all(self, method: str, *args: Any, **kwargs: Any) -> Any:
        import ray

        return ray.get([getattr(a, method).remote(*args, **kwargs) for a in self.actors])[0]

    def update(
        self, trajectories: Sequence[Trajectory], *, scores: Sequence[torch.Tensor] | None = None
    ) -> UpdateStats:
        """One optimizer step on every actor; rank 0's :class:`UpdateStats`."""
        stats = self._all("update", list(trajectories), scores=scores)
        self._version = stats.version
        return stats

    def score(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current log-probabilities per trajectory (see :meth:`OpenRLHFLearner.score`)."""
        return self._all("score", list(trajectories))

    def entropy(self, trajectories: Sequence[Trajectory]) -> float:
        """Mean entropy of pi at the trajectories' policy tokens (see :meth:`OpenRLHFLearner.entropy`)."""
        return self._all("entropy", list(trajectories))

    @property
    def version(self) -> int:
        """Policy version (kept here, so reading it never waits for a running update)."""
        return self._version

    def weights_for_engine(self, path: Path | str | None = None) -> dict[str, torch.Tensor] | Path:
        """Full weights, or the LoRA adapters alone (or a file written by rank 0); ZeRO-3 gathers on all actors."""
        return self._all("weights_for_engine", path)

    def save(self, root: Path | str, *, pool_state: dict | None = None, extra: dict | None = None,
             keep: int = 2) -> Path:
        """Checkpoint as :meth:`OpenRLHFLearner.save`, from every actor.

        Rank 0's full weights (adapters and base), then every actor's DeepSpeed state, go into the same unpublished
        folder (one node, or a folder all nodes share).

        Raises:
            CheckpointError: the write failed; the previous checkpoint stays the latest.
        """
        import ray

        from agentenv.trainer.checkpoint import save_checkpoint

        def write_state(folder: Path) -> None:
            ray.get([a.save_state.remote(str(folder)) for a in self.actors])

        return save_checkpoint(
            root, model=self._all("checkpoint_weights"), optimizer=None, scheduler=None, version=self._version,
            pool_state=pool_state, extra=extra, keep=keep, write_state=write_state,
        )

    def restore(self, path: Path | str) -> LoadedCheckpoint:
        """Resume every actor from a checkpoint written by :meth:`save` (version included).

        Raises:
            CheckpointError: missing or corrupt checkpoint, or one without DeepSpeed state.
        """
        import ray

        from agentenv.trainer.checkpoint import load_checkpoint

        def read_state(folder: Path) -> None:
            ray.get([a.load_state.remote(str(folder)) for a in self.actors])

        loaded = load_checkpoint(path, model=None, read_state=read_state)
        ray.get([a.set_version.remote(loaded.version) for a in self.actors])
        self._version = loaded.version
        return loaded


class _LearnerActor:
    """Body of a Ray learner actor: OpenRLHF's rendezvous, then an :class:`OpenRLHFLearner`.

    Defined at module level (Ray pickles it by reference) and not as a subclass of OpenRLHF's
    ``BaseDistributedActor``: importing that class needs flash-attn, and a Ray worker unpickles the
    class before any of our code could install the stand-in. Its ``__init__`` is called explicitly.
    """

    def __init__(self, world_size: int, rank: int, master_addr: str | None, master_port: int | None) -> None:
        BaseDistributedActor = import_openrlhf().BaseDistributedActor  # noqa: N806 (flash-attn stand-in first)
        addr = master_addr or BaseDistributedActor._get_current_node_ip()
        port = master_port or BaseDistributedActor._get_free_port()
        BaseDistributedActor.__init__(self, world_size, rank, addr, port)  # type: ignore[arg-type]

    def get_master_addr_port(self) -> tuple[str, int]:
        return self._master_addr, self._master_port  # type: ignore[attr-defined]

    def init_learner(
        self,
        model_factory: Callable[[], nn.Module],
        optim: OptimConfig,
        backend: OpenRLHFBackendConfig,
        sampling: SamplingTransform | None = None,
        total_steps: int | None = None,
        objective: ObjectiveConfig | None = None,
        execution: LearnerConfig | None = None,
        loss_constant: float | None = None,
    ) -> None:
        self.learner = OpenRLHFLearner(model_factory(), optim, backend, objective=objective, execution=execution,
                                       sampling=sampling, total_steps=total_steps, loss_constant=loss_constant)

    def update(self, trajectories: list[Trajectory], scores: list[torch.Tensor] | None = None) -> UpdateStats:
        return self.learner.update(trajectories, scores=scores)

    def score(self, trajectories: list[Trajectory]) -> list[torch.Tensor]:
        return self.learner.score(trajectories)

    def entropy(self, trajectories: list[Trajectory]) -> float:
        return self.learner.entropy(trajectories)

    def get_version(self) -> int:
        return self.learner.version

    def set_version(self, version: int) -> None:
        self.learner.version = version

    def save_state(self, folder: str) -> None:
        self.learner.save_state(folder)

    def load_state(self, folder: str) -> None:
        self.learner.load_state(folder)

    def weights_for_engine(self, path: str | None = None) -> Any:
        return self.learner.weights_for_engine(path)

    def checkpoint_weights(self) -> dict[str, torch.Tensor]:
        return self.learner.checkpoint_weights()
