"""The training configuration: typed, frozen dataclasses nested by concern.

A recipe file (``recipes/<name>.yaml``) is a saved :class:`TrainConfig`; every value can be
overridden from the command line (``--optim.lr 1e-5`` or ``optim.lr=1e-5``). Each section's defaults live
in its class; a section that code outside training reads lives beside that code: ``model``
(:class:`~agentenv.engines.build.ModelConfig`), ``rollout`` (:class:`~agentenv.rollout.episode.RolloutConfig`),
``eval`` (:class:`~agentenv.evaluation.EvalConfig`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agentenv.engines.build import ModelConfig
from agentenv.errors import ConfigError
from agentenv.evaluation import EvalConfig
from agentenv.rollout.collector import MAX_RETRIES
from agentenv.rollout.episode import RolloutConfig
from agentenv.rollout.staleness import StalenessConfig
from agentenv.step_latency import StepLatencyConfig
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.lr_schedule import decay_length, warmup_length
from agentenv.trainer.warmup import WarmupConfig


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, built with which constructor arguments; the trainer knows no env by name."""

    # Constructor arguments that a config.yaml may set as env fields, with where each belongs: the
    # unknown-field ConfigError of agentenv.configio.load_config names it.
    MOVED_FIELDS: ClassVar[dict[str, str]] = {
        "dataset": "env.kwargs.dataset",
        "eval_dataset": "env.eval_kwargs.dataset",
        "max_problem_chars": "env.kwargs.max_problem_chars",
    }

    id: str = "python_tool"
    """Registered environment id (``agentenv envs`` lists them)."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments of the training environment: ``make(id, **kwargs)`` (e.g. python_tool's
    ``dataset``, ``max_turns``, ``sandbox_backend``; ALFWorld's ``split``, ``max_steps``). An argument the
    constructor does not take is a ConfigError naming the ones it takes."""
    eval_kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments merged over ``kwargs`` to build the held-out environment
    (``make(id, **{**kwargs, **eval_kwargs})``, e.g. ``{dataset: tool_arith_eval}`` or
    ``{split: valid_unseen}``); its :meth:`~agentenv.core.Env.tasks` are the held-out tasks."""
    remote: str | list[str] | None = None
    """``agentenv serve`` server URL(s) playing ``id`` (``http://host:port``; a list is balanced
    across episodes), for training and held-out episodes alike; None: the env runs in this process.
    The servers own the constructor arguments, so ``kwargs`` and ``eval_kwargs`` must be empty."""
    step_latency: StepLatencyConfig = field(default_factory=StepLatencyConfig)
    """A long-tailed delay before every step of the training environments, for any env
    (:mod:`agentenv.step_latency`): lognormal with median ``median_s`` seconds and shape ``sigma``,
    seeded by the episode seed, awaited without blocking the loop; e.g. ``{median_s: 2.0, sigma: 1.0}``
    for a slow tool. Off (``median_s: 0``) by default; the held-out evaluation runs without it."""

    def __post_init__(self) -> None:
        if self.remote is not None:
            from agentenv.remote.client import server_urls

            server_urls(self.remote)
            if self.kwargs or self.eval_kwargs:
                raise ConfigError("env.remote: env.kwargs and env.eval_kwargs must be empty (the servers build "
                                  "the env: agentenv serve ID --env-arg KEY=VALUE)")


@dataclass(frozen=True)
class RunConfig:
    """The loop: how many updates, how much overlap, where results go.

    An episode that failed for reasons outside the policy (engine, environment or template error, no
    policy token) never enters a batch; its task is replayed up to
    :data:`agentenv.rollout.collector.MAX_RETRIES` (2) times, then dropped (``episodes/dropped_tasks``); under
    GRPO per group member, and a dropped task drops its group. Rollouts per task are
    ``objective.grpo_group_size`` under ``objective.name: grpo``, else 1 (one rollout per prompt).
    """

    FIXED_FIELDS: ClassVar[dict[str, tuple[object, str]]] = {
        "max_task_retries": (MAX_RETRIES, "replays of a task whose episode failed outside the policy, "
                                          "agentenv.rollout.collector.MAX_RETRIES"),
        "mode": ("async", "staleness.policy=sync alternates generation and training, every other policy "
                          "overlaps them")}

    @property
    def batch_limit(self) -> int:
        """``max_batches``, or 4 x ``updates`` when it is None (batches)."""
        return self.max_batches if self.max_batches is not None else 4 * self.updates

    run_dir: str = "runs/python_tool_cpu"
    """Folder for config, metrics, TensorBoard events, checkpoints and plots."""
    updates: int = 20
    """Optimizer steps (= policy versions) to train for. A batch that carries no gradient (every
    reward equal, or every row rejected by the gate) takes no step and does not count (see
    ``max_batches``)."""
    max_batches: int | None = None
    """Most batches the loop consumes, stepped or not; None: 4 x ``updates``. A policy that never
    succeeds (or always succeeds) yields only batches without gradient; the run then ends here with a
    warning instead of waiting for an update that cannot come."""
    batch_size: int = 8
    """B: trajectories per update (one rollout per prompt)."""
    concurrency: int = 8
    """Episodes in flight at once."""
    max_pool_size: int = 64
    """Back-pressure: no new episode starts while this many trajectories wait in the pool or are being
    played (episodes in flight count one each), so the pool never holds more. Above ``batch_size``
    by ``concurrency`` the engine plays the next batch while the learner steps."""
    checkpoint_every: int = 10
    """Updates between checkpoints (a final one is always written)."""
    entropy_probe: int = 4
    """Rows of the first batch this process consumes kept as a fixed probe: after every update the
    learner measures the mean entropy of pi at their policy tokens (``probe/policy_entropy``, nats per
    token), the same states every time, so the figure moves with the policy and not with the batch's
    success. It measures drift on those states; a run-away into new ones (long replies without a tool
    call) shows in the batch's entropy, tool calls and truncation instead (docs/stability.md). 0: off.
    Each update pays one no-grad forward pass of these rows: on the CPU default 0.09 x the learner
    update for 4 rows, 0.32 x for 16 (``benchmarks/bench_entropy_probe.py``)."""
    seed: int = 0
    """Seeds torch, the task stream and the sampler."""

    def __post_init__(self) -> None:
        if self.updates < 1 or self.batch_size < 1 or self.concurrency < 1:
            raise ConfigError("run.updates, run.batch_size and run.concurrency must be >= 1")
        if self.max_batches is not None and self.max_batches < 1:
            raise ConfigError(f"run.max_batches must be >= 1 or null, got {self.max_batches}")
        if self.entropy_probe < 0:
            raise ConfigError(f"run.entropy_probe must be >= 0 rows (0: off), got {self.entropy_probe}")
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
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)

    def __post_init__(self) -> None:
        if not self.rollout.temperature > 0:
            raise ConfigError("rollout.temperature must be > 0 for training (greedy decoding has no "
                              "behaviour distribution to correct for); eval.temperature may be 0")
        from agentenv.engines.sampling import SamplingTransform

        # The learner scores log pi under the rollout's processing; refuse now what it could not build.
        SamplingTransform(self.rollout.temperature, self.rollout.top_p, self.rollout.top_k)
        # a constant schedule may warm up past run.updates (a run trained in pieces with --resume); the
        # cosine schedule decays over run.updates and needs steps after its warm-up (a warmup_ratio < 1
        # always leaves some); wsd needs its warm-up and its decay inside the run
        warm, updates = warmup_length(self.optim, self.run.updates), self.run.updates
        if self.optim.lr_schedule == "cosine" and warm >= updates:
            raise ConfigError(f"optim.warmup_steps ({warm}) is longer than the run (run.updates = {updates}): "
                              "the cosine schedule needs steps after the warm-up")
        decay = decay_length(self.optim, updates)
        if self.optim.lr_schedule == "wsd" and warm + decay > updates:
            raise ConfigError(f"optim.lr_schedule=wsd: the warm-up ({warm} updates) and the decay ({decay} updates, "
                              f"optim.decay_ratio = {self.optim.decay_ratio}) do not fit in run.updates = {updates}")
        if self.objective.name == "grpo":  # a group baseline over mixed prompts is meaningless
            # objective.grpo_group_size is the one source of rollouts per task (ObjectiveConfig refuses n < 2)
            n = self.objective.grpo_group_size
            if self.rollout.on_prefix_violation == "split":
                raise ConfigError(f"objective.name=grpo (groups of {n}) with rollout.on_prefix_violation=split: a "
                                  "split episode gives several samples, and a group's baseline needs one row per "
                                  "rollout; use rollout.on_prefix_violation=append (or FlashREINFORCE)")
            if self.run.batch_size % n:
                raise ConfigError(f"objective.name=grpo: run.batch_size ({self.run.batch_size}) must be a multiple "
                                  f"of objective.grpo_group_size ({n}); a batch is whole groups of {n} rollouts "
                                  "of one task")
        per_step = self.learner.micro_batch_size * self.learner.world_size
        if self.learner.backend != "single" and self.run.batch_size % per_step:
            raise ConfigError(f"run.batch_size ({self.run.batch_size}) must be a multiple of learner.micro_batch_size "
                              f"* learner.world_size = {per_step} for the {self.learner.backend} learner")
        if self.learner.lora_rank and self.model.engine == "vllm" and self.learner.lora_rank > 512:
            raise ConfigError(f"learner.lora_rank={self.learner.lora_rank}: vLLM serves adapters of rank 512 at most")
