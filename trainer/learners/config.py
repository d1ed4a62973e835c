"""The learner's three settings: the optimizer, the objective, and how one update is executed.

``optim`` (:class:`OptimConfig`) is AdamW and its learning-rate schedule; ``objective``
(:class:`ObjectiveConfig`) is the loss, FlashREINFORCE (the method) or GRPO (the comparison); ``learner``
(:class:`LearnerConfig`) is where the update runs and how its rows are cut into passes, which changes
speed and memory, never the gradient. Every backend (:mod:`agentenv.trainer.learners.single`,
:mod:`agentenv.trainer.learners.openrlhf`, :mod:`agentenv.trainer.learners.ray_group`) takes all three.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from agentenv.errors import ConfigError
from agentenv.trainer.learners.logprob_chunks import DEFAULT_CHUNK_TOKENS
from agentenv.trainer.lr_schedule import SCHEDULES
from agentenv.trainer.objectives import _check_fraction, check_is_truncation
from agentenv.trainer.trust_gate import check_delta, check_gate

GRPO_CLIP_EPS_NOTE = "the constant 0.2 of PPO and GRPO (trainer/objectives.py, grpo_loss)"

TRUNCATION_PENALTY = 1.0
"""Reward units subtracted from a trajectory cut by a token budget under ``objective.truncation: penalty``."""

__all__ = ["TRUNCATION_PENALTY", "LearnerConfig", "ObjectiveConfig", "OptimConfig"]


@dataclass(frozen=True)
class OptimConfig:
    """AdamW and its learning-rate schedule (paper defaults: docs/algorithms.md, "FlashREINFORCE").

    Attributes:
        lr: AdamW learning rate (per optimizer step; the peak of a schedule).
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW (beta1, beta2).
        adam_eps: AdamW epsilon.
        grad_clip: Max global gradient L2 norm; 0 disables clipping.
        lr_schedule: ``"constant"``, ``"cosine"`` (decay over the run's ``run.updates`` optimizer
            steps to ``min_lr_ratio * lr``) or ``"wsd"`` (the peak until the last ``decay_ratio`` of the
            run, then the same cosine down to ``min_lr_ratio * lr``), after the warm-up
            (:mod:`agentenv.trainer.lr_schedule`).
        warmup_steps: Linear learning-rate warm-up over this many optimizer steps (0: none); under
            ``"cosine"`` fewer than ``run.updates`` (a constant schedule may warm up across a run
            trained in pieces with ``--resume``).
        warmup_ratio: The warm-up as a share of the run's optimizer steps, in [0, 1): ``W =
            floor(warmup_ratio * run.updates)`` (the paper: 0.03), so the same recipe warms up in
            proportion at any ``--updates`` and a one-update run has no warm-up; 0 uses
            ``warmup_steps``. Setting both is a config error.
        min_lr_ratio: The decay's final lr as a fraction of ``lr``, in [0, 1] (the paper: 0.1); unused
            by ``"constant"``.
        decay_ratio: ``"wsd"`` only: the final decay as a share of the run's optimizer steps, in (0, 1]:
            ``D = max(1, floor(decay_ratio * run.updates))``.
        step_on_zero_gradient: Take the optimizer step (and bump the version) even when the batch
            carries no gradient (all rows rejected or zero advantage). Default False: skip it.
    """

    # Fields that lived here before the objective and the execution had their own sections.
    MOVED_FIELDS: ClassVar[dict[str, str]] = {
        "objective": "objective.name",
        **{k: f"objective.{k}" for k in ("delta", "gate", "loss_aggregation", "entropy_keep_fraction",
                                         "advantage_clip_negative", "truncation", "grpo_group_size")},
        "truncation_penalty": "the fixed TRUNCATION_PENALTY of objective.truncation: penalty",
        "grpo_clip_eps": GRPO_CLIP_EPS_NOTE,
        **{k: f"learner.{k}" for k in ("micro_batch_size", "max_tokens_per_micro_batch", "logprob_chunk_tokens",
                                       "gradient_checkpointing")},
        "share_prefix": "always on where the model allows it (LearnerConfig)",
    }

    lr: float = 1e-6
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    lr_schedule: Literal["constant", "cosine", "wsd"] = "constant"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    min_lr_ratio: float = 0.1
    decay_ratio: float = 0.2
    step_on_zero_gradient: bool = False

    def __post_init__(self) -> None:
        if not self.lr > 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ConfigError("optim.lr must be > 0; optim.weight_decay, optim.grad_clip and optim.warmup_steps "
                              "must be >= 0")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"optim.warmup_ratio (the warm-up's share of the run) must lie in [0, 1), "
                              f"got {self.warmup_ratio}")
        if self.warmup_ratio > 0 and self.warmup_steps > 0:
            raise ConfigError(f"optim.warmup_steps ({self.warmup_steps}) and optim.warmup_ratio "
                              f"({self.warmup_ratio}) both set: give the warm-up one way "
                              "(optim.warmup_ratio=0 to count it in steps)")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if not self.adam_eps > 0:
            raise ConfigError(f"optim.adam_eps must be > 0, got {self.adam_eps}")
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(f"optim.lr_schedule must be one of {', '.join(SCHEDULES)}; got {self.lr_schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio (the decay's final lr / lr) must lie in [0, 1], "
                              f"got {self.min_lr_ratio}")
        if not 0.0 < self.decay_ratio <= 1.0:
            raise ConfigError(f"optim.decay_ratio (the wsd schedule's decay as a share of the run) must lie in "
                              f"(0, 1], got {self.decay_ratio}")


@dataclass(frozen=True)
class ObjectiveConfig:
    """The loss: FlashREINFORCE (the method) or GRPO (the comparison baseline), and its ablations.

    Attributes:
        name: ``"flash_reinforce"`` (one rollout per prompt, batch-mean baseline, sequence trust
            gate, sample-mean loss) or ``"grpo"`` (groups of ``grpo_group_size`` rollouts of a prompt).
        delta: FlashREINFORCE gate threshold on D_i (nats), admitted iff ``D_i <= delta``.
        gate: FlashREINFORCE only: the trust gate on the Bernoulli-KL proxy
            (:func:`agentenv.trainer.trust_gate.trust_gate`). ``"sequence"`` (default, the method):
            a row is admitted iff ``D_i <= delta``; ``"token"``: each policy token is admitted iff its
            own term ``d_t <= delta`` (denominator still ``T_i``); ``"none"``: every row admitted.
            ``learner/mean_d`` is the mean ``D_i`` in every mode; ``learner/admitted_fraction`` the
            share of rows with an admitted token, ``learner/admitted_token_fraction`` the share of
            policy tokens admitted (``agentenv study gate_under_lag``).
        loss_aggregation: FlashREINFORCE only: ``"sample_mean"`` (the method: each trajectory's tokens
            averaged over its ``T_i``, then over B), ``"token_mean"`` (every policy token of the
            batch weighs ``1/N``; the ablation, ``agentenv study sample_vs_token_mean``) or
            ``"constant"`` (each trajectory's token sum divided by one constant ``K`` instead of its
            ``T_i``, then averaged over B, so a long failed trajectory is not down-weighted per token;
            ``agentenv study loss_normaliser``). ``K`` is the rollout's policy-token budget per
            trajectory, ``min(rollout.max_turns * rollout.max_new_tokens_per_turn,
            rollout.max_total_tokens)`` (:attr:`agentenv.rollout.episode.RolloutConfig.policy_token_budget`),
            given to the learner when it is built. GRPO is always token-mean (``"constant"`` is
            refused there).
        is_truncation: FlashREINFORCE only: truncated importance sampling (unrelated to ``truncation``,
            which treats trajectories cut by a token budget). ``C > 0``: the per-token
            importance ratio ``rho = pi_theta / mu`` is replaced by ``min(rho, C)`` in the loss (still
            detached); ``learner/rho_truncated_fraction`` logs the share of policy tokens whose ratio
            exceeded ``C``. None (the default): off.
        entropy_keep_fraction: FlashREINFORCE negative-token entropy filter ``q`` in [0, 1]; None off.
        advantage_clip_negative: Replace each advantage by ``max(A_i, 0)`` after the baseline
            (FlashREINFORCE's batch mean or GRPO's group normalisation): failed trajectories then carry
            no gradient, only the better-than-average ones are reinforced. Off by default; the ablation
            of the FlashREINFORCE paper's signed-feedback claim (``agentenv study signed_feedback``).
        truncation: What a trajectory ended by a token budget (per turn, total or context;
            :func:`agentenv.rollout.episode.is_token_budget_cut`) does in the loss. ``"keep"`` (default):
            it keeps its reward like any other row (environments never grade a cut reply unless
            they ask to, so it usually holds 0 and teaches brevity). ``"mask"``: it gets advantage 0
            and is left out of the batch-mean baseline (DAPO's overlong filtering, arXiv 2503.14476
            sec. 3.4); it still counts in B. ``"penalty"``: :data:`TRUNCATION_PENALTY` (1 reward unit,
            the whole range of a 0/1 reward) is subtracted from its reward before the advantages
            (DAPO's overlong punishment at its hard limit).
        grpo_group_size: GRPO samples per prompt (contiguous rows); must be >= 2. The one source of
            rollouts per task under ``name: grpo`` (FlashREINFORCE: one).
    """

    MOVED_FIELDS: ClassVar[dict[str, str]] = {"grpo_clip_eps": GRPO_CLIP_EPS_NOTE}
    FIXED_FIELDS: ClassVar[dict[str, tuple[object, str]]] = {
        "truncation_penalty": (TRUNCATION_PENALTY, "the reward units objective.truncation: penalty subtracts"),
        "loss_constant": (None, "the constant normaliser is the rollout's policy-token budget")}

    name: Literal["flash_reinforce", "grpo"] = "flash_reinforce"
    delta: float = 1e-3
    gate: Literal["sequence", "token", "none"] = "sequence"
    loss_aggregation: Literal["sample_mean", "token_mean", "constant"] = "sample_mean"
    is_truncation: float | None = None
    entropy_keep_fraction: float | None = None
    advantage_clip_negative: bool = False
    truncation: Literal["keep", "mask", "penalty"] = "keep"
    grpo_group_size: int = 8

    def __post_init__(self) -> None:
        if self.name not in ("flash_reinforce", "grpo"):
            raise ConfigError(f"objective.name must be 'flash_reinforce' or 'grpo', got {self.name!r}")
        check_gate(self.gate, "objective.gate")
        if self.loss_aggregation not in ("sample_mean", "token_mean", "constant"):
            raise ConfigError(f"objective.loss_aggregation must be 'sample_mean', 'token_mean' or 'constant', "
                              f"got {self.loss_aggregation!r}")
        check_is_truncation(self.is_truncation, "objective.is_truncation")
        if self.truncation not in ("keep", "mask", "penalty"):
            raise ConfigError(f"objective.truncation must be 'keep', 'mask' or 'penalty', got {self.truncation!r}")
        check_delta(self.delta)
        if self.entropy_keep_fraction is not None:
            _check_fraction(self.entropy_keep_fraction)
        if self.name == "grpo":
            if self.gate != "sequence":
                raise ConfigError(f"objective.gate {self.gate!r} is FlashREINFORCE's trust gate; GRPO has none "
                                  "(leave objective.gate at 'sequence')")
            if self.is_truncation is not None:
                raise ConfigError("objective.is_truncation caps FlashREINFORCE's detached importance ratio; GRPO "
                                  "clips its own ratio (leave objective.is_truncation null)")
            if self.loss_aggregation == "constant":
                raise ConfigError("objective.loss_aggregation 'constant' is a FlashREINFORCE normaliser; GRPO is "
                                  "always token-mean")
            if self.truncation == "mask":
                raise ConfigError("objective.truncation 'mask' is defined for FlashREINFORCE's batch baseline "
                                  "only; with grpo use 'keep' or 'penalty'")
            if self.grpo_group_size < 2:
                raise ConfigError(
                    f"GRPO needs objective.grpo_group_size >= 2 (got {self.grpo_group_size}): with n = 1 the "
                    "group baseline makes every advantage 0"
                )


@dataclass(frozen=True)
class LearnerConfig:
    """Where the update runs (this process, one DeepSpeed process, Ray actors) and how its rows are cut.

    Every backend takes exactly one optimizer step per fresh batch of ``run.batch_size`` trajectories,
    with the global denominators of FlashREINFORCE, and runs the same micro-step
    (:mod:`agentenv.trainer.learners.update_step`), so these settings change speed and memory, not the maths.

    The token prefix every row of the batch shares (the system prompt and tool schemas; a GRPO group's
    whole prompt) runs through the model once per step, and every micro-batch attends to that one KV
    cache (:func:`agentenv.trainer.learners.forward.shared_prefix_length`,
    :mod:`agentenv.trainer.learners.shared_prefix`);
    its gradient, summed over the micro-batches, is back-propagated through the prefix once at the end.
    The log-probabilities and the gradient are those of the plain padded pass; only the compute shrinks,
    by about ``(B - 1) * prefix / (B * L)``. This happens whenever the batch holds 2 or more rows sharing
    at least 16 tokens, for a transformers model without activation checkpointing (whose layers drop the
    cache) outside ZeRO-3; otherwise the plain pass runs.

    Attributes:
        micro_batch_size: Rows per forward/backward pass at most (gradient accumulation; does not
            change the gradient).
        max_tokens_per_micro_batch: Token budget of one micro-batch's pass (tokens, >= 1), or None
            (micro-batches of ``micro_batch_size`` consecutive rows). Rows are sorted by length and
            packed while ``rows * (longest row - shared prefix)`` stays within it (and rows <=
            ``micro_batch_size``), so activation memory follows this budget, not B or the longest
            reply; a row longer than the budget runs alone (:func:`agentenv.trainer.batching.micro_batch_rows`).
        logprob_chunk_tokens: Tokens per vocabulary projection of the log-probabilities (>= 1): no
            ``(tokens, V)`` float32 logits tensor larger than ``(logprob_chunk_tokens, V)`` is alive
            (:func:`agentenv.trainer.learners.logprob_chunks.chunked_label_logprobs`, logits recomputed in the
            backward pass); the values and the gradient do not depend on it.
        gradient_checkpointing: Recompute each decoder layer's activations in the backward pass
            instead of keeping them (transformers' activation checkpointing, non-reentrant):
            activation memory of a row drops from all layers to about one, for one extra forward.
            The gradient is unchanged.
        lora_rank: 0 (default): train every weight. ``r >= 1``: train LoRA adapters of rank ``r`` on
            ``lora_target_modules`` only, the base weights frozen, and sync only the adapters to the
            engine (:mod:`agentenv.trainer.learners.lora`; every backend, either engine).
        lora_alpha: LoRA's scale numerator: the update is ``(lora_alpha / lora_rank) B A``. 32 as in
            "LoRA Without Regret" (Schulman et al., Thinking Machines, 2025), which also finds the best
            LoRA lr about 10x the full fine-tuning one.
        lora_target_modules: Linear layers to adapt, by their last name component (``q_proj``,
            ``v_proj``, ...), or ``["all-linear"]``: every linear layer but the output projection (the
            same reference: attention-only LoRA learns worse).

    LoRA has no dropout setting: dropout on the adapters would make the learner's log-probabilities
    those of a randomly thinned policy, not of the one the engine sampled, so at policy lag 0 the
    importance ratio and the sampling check (``sync/probe_logprob_gap``) would measure noise.
    """

    MOVED_FIELDS: ClassVar[dict[str, str]] = {
        "share_prefix": "always on where the model allows it (the class docstring says when)",
        "ray_address": "Ray's own RAY_ADDRESS environment variable (unset: a private Ray on this machine)",
        "num_gpus_per_actor": "one GPU per Ray learner rank when the Ray cluster has GPUs, none without",
    }

    backend: str = "single"
    """``"single"``: :class:`agentenv.trainer.learners.single.Learner` in this process (CPU or one GPU).
    ``"openrlhf"``: OpenRLHF's DeepSpeed strategy in this process (world size 1; gloo on a CPU, NCCL
    on a GPU). ``"ray"``: ``world_size`` Ray actors, each an OpenRLHF/DeepSpeed rank (data parallel;
    one or more GPUs each, on one node or a Ray cluster)."""
    world_size: int = 1
    """Data-parallel learner ranks (processes); > 1 needs ``backend: ray``."""
    zero_stage: int = 2
    """``openrlhf``/``ray``: DeepSpeed ZeRO stage 0-3 (3 partitions the weights too; gathered for the engine)."""
    param_dtype: str = "fp32"
    """``openrlhf``/``ray``: training dtype, ``"fp32"``, ``"bf16"`` (GPUs) or ``"fp16"``."""
    micro_batch_size: int = 4
    max_tokens_per_micro_batch: int | None = None
    logprob_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    gradient_checkpointing: bool = False
    lora_rank: int = 0
    lora_alpha: float = 32.0
    lora_target_modules: tuple[str, ...] = ("all-linear",)

    def __post_init__(self) -> None:
        if self.backend not in ("single", "openrlhf", "ray"):
            raise ConfigError(f"learner.backend must be 'single', 'openrlhf' or 'ray', got {self.backend!r}")
        if self.world_size < 1:
            raise ConfigError(f"learner.world_size must be >= 1, got {self.world_size}")
        if self.world_size > 1 and self.backend != "ray":
            raise ConfigError(f"learner.world_size={self.world_size} needs learner.backend 'ray' "
                              f"('{self.backend}' runs one learner process)")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"learner.zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.param_dtype not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"learner.param_dtype must be 'fp32', 'bf16' or 'fp16', got {self.param_dtype!r}")
        if self.backend == "single" and self.param_dtype != "fp32":
            raise ConfigError("learner.param_dtype applies to the openrlhf and ray backends; the single "
                              "learner trains in the model's own dtype (leave param_dtype at fp32)")
        if self.micro_batch_size < 1:
            raise ConfigError(f"learner.micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ConfigError(f"learner.max_tokens_per_micro_batch must be >= 1 token (or null: rows only), "
                              f"got {self.max_tokens_per_micro_batch}")
        if self.lora_rank < 0:
            raise ConfigError(f"learner.lora_rank must be >= 0 (0: full fine-tuning), got {self.lora_rank}")
        if self.lora_rank and not self.lora_alpha > 0:
            raise ConfigError(f"learner.lora_alpha must be > 0, got {self.lora_alpha}")
        if self.logprob_chunk_tokens < 1:
            raise ConfigError(f"learner.logprob_chunk_tokens must be >= 1 token per vocabulary projection, "
                              f"got {self.logprob_chunk_tokens}")
