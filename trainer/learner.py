"""A single-process learner (CPU or one GPU, optionally data-parallel over torch.distributed).

``Learner(model, config)`` owns the model, the AdamW optimizer and a warmup scheduler; it scores
trajectories for PACE's drift and the gate, and applies exactly one optimizer step per fresh batch
with :mod:`agentenv.trainer.objectives` (FlashREINFORCE or GRPO), accumulating gradients over
micro-batches with the *global* denominators B and T_i (or N for GRPO). Under torch.distributed
every rank receives the whole batch, works on its contiguous share of the rows, and the partial
gradients are all-reduced with SUM (the denominators are global, so no averaging).

Policy version = number of optimizer steps taken. A batch that carries no gradient at all (every
row rejected by the gate, or every admitted row with advantage exactly 0) is discarded *without* an
optimizer step by default (``OptimConfig.step_on_zero_gradient = False``): AdamW would otherwise
still move the weights (decoupled weight decay and the momentum of earlier batches) with no learning
signal, and bump the version, which would count as staleness for every trajectory in flight. The
skip is reported in :class:`UpdateStats` (``stepped = False``) and logged.
"""

from __future__ import annotations

import inspect
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from agentenv.engines.sampling import SamplingTransform, label_logprobs
from agentenv.errors import ConfigError, DataError
from agentenv.malloc import release_free_heap
from agentenv.rollout import is_token_budget_cut
from agentenv.trainer.batching import PolicyBatch, build_batch, micro_batch_rows, shard, split_micro_batches
from agentenv.trainer.logprob_chunks import DEFAULT_CHUNK_TOKENS, chunked_label_logprobs, split_head
from agentenv.trainer.lr_schedule import SCHEDULES, apply_optim_settings, build_scheduler, log_applied
from agentenv.trainer.objectives import (
    ObjectiveOutput,
    ObjectiveStats,
    _check_delta,
    _check_fraction,
    batch_mean_advantages,
    check_gate,
    flash_reinforce_loss,
    group_advantages,
    grpo_loss,
    masked_batch_mean_advantages,
    trust_gate,
)
from agentenv.trainer.shared_prefix import SharedPrefix
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.trainer.checkpoint import LoadedCheckpoint

__all__ = [
    "Learner",
    "OptimConfig",
    "UpdateStats",
    "enable_gradient_checkpointing",
    "prepare_batch",
    "shared_prefix_length",
    "token_logprobs",
    "update_stats",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and objective settings (paper defaults: docs/algorithms.md, "FlashREINFORCE").

    Attributes:
        objective: ``"flash_reinforce"`` (the method) or ``"grpo"`` (the comparison baseline).
        lr: AdamW learning rate (per optimizer step).
        weight_decay: AdamW decoupled weight decay.
        betas: AdamW (beta1, beta2).
        adam_eps: AdamW epsilon.
        grad_clip: Max global gradient L2 norm; 0 disables clipping.
        lr_schedule: ``"constant"`` or ``"cosine"`` (decay over the run's ``run.updates`` optimizer
            steps to ``min_lr_ratio * lr``), after the warm-up (:mod:`agentenv.trainer.lr_schedule`).
        warmup_steps: Linear learning-rate warm-up over this many optimizer steps (0: none); under
            ``"cosine"`` fewer than ``run.updates`` (a constant schedule may warm up across a run
            trained in pieces with ``--resume``).
        min_lr_ratio: The cosine schedule's final lr as a fraction of ``lr``, in [0, 1] (the paper:
            0.1); unused by ``"constant"``.
        micro_batch_size: Rows per forward/backward pass (gradient accumulation; does not change the
            gradient).
        delta: FlashREINFORCE gate threshold on D_i (nats), admitted iff ``D_i <= delta``.
        entropy_keep_fraction: FlashREINFORCE negative-token entropy filter ``q`` in [0, 1]; None off.
        grpo_group_size: GRPO samples per prompt (contiguous rows); must be >= 2.
        grpo_clip_eps: GRPO/PPO ratio clip epsilon.
        step_on_zero_gradient: Take the optimizer step (and bump the version) even when the batch
            carries no gradient (all rows rejected or zero advantage). Default False: skip it.
        share_prefix: Run the token prefix that every row of the batch shares (the system prompt and
            tool schemas; a GRPO group's whole prompt) through the model once per step and let every
            micro-batch attend to that one KV cache (:func:`shared_prefix_length`,
            :mod:`agentenv.trainer.shared_prefix`); its gradient, summed over the micro-batches, is
            back-propagated through the prefix once at the end. The log-probabilities and the gradient
            are those of the plain padded pass; only the compute shrinks, by about
            ``(B - 1) * prefix / (B * L)``. Used when the batch holds 2 or more rows sharing at least 16
            tokens, for a transformers model without activation checkpointing (whose layers drop the
            cache); otherwise the plain pass runs.
        max_tokens_per_micro_batch: Token budget of one micro-batch's pass (tokens, >= 1), or None
            (micro-batches of ``micro_batch_size`` consecutive rows). Rows are sorted by length and
            packed while ``rows * (longest row - shared prefix)`` stays within it (and rows <=
            ``micro_batch_size``), so activation memory follows this budget, not B or the longest
            reply; a row longer than the budget runs alone (:func:`agentenv.trainer.batching.micro_batch_rows`).
        logprob_chunk_tokens: Tokens per vocabulary projection of the log-probabilities (>= 1): no
            ``(tokens, V)`` float32 logits tensor larger than ``(logprob_chunk_tokens, V)`` is alive
            (:func:`agentenv.trainer.logprob_chunks.chunked_label_logprobs`, logits recomputed in the
            backward pass); the values and the gradient do not depend on it.
        gradient_checkpointing: Recompute each decoder layer's activations in the backward pass
            instead of keeping them (transformers' activation checkpointing, non-reentrant):
            activation memory of a row drops from all layers to about one, for one extra forward.
            The gradient is unchanged.
        truncation: What a trajectory ended by a token budget (per turn, total or context;
            :func:`agentenv.rollout.is_token_budget_cut`) does in the loss. ``"keep"`` (default):
            it keeps its reward like any other row (environments never grade a cut reply unless
            they ask to, so it usually holds 0 and teaches brevity). ``"mask"``: it gets advantage 0
            and is left out of the batch-mean baseline (DAPO's overlong filtering, arXiv 2503.14476
            sec. 3.4); it still counts in B. ``"penalty"``: ``truncation_penalty`` is subtracted from
            its reward before the advantages (DAPO's overlong punishment at its hard limit).
        truncation_penalty: Reward units subtracted under ``truncation: penalty`` (>= 0).
        advantage_clip_negative: Replace each advantage by ``max(A_i, 0)`` after the baseline
            (FlashREINFORCE's batch mean or GRPO's group normalisation): failed trajectories then carry
            no gradient, only the better-than-average ones are reinforced. Off by default; the ablation
            of the FlashREINFORCE paper's signed-feedback claim (``agentenv study signed_feedback``).
        loss_aggregation: FlashREINFORCE only: ``"sample_mean"`` (the method: each trajectory's tokens
            averaged over its ``T_i``, then over B) or ``"token_mean"`` (every policy token of the
            batch weighs ``1/N``; the ablation, ``agentenv study sample_vs_token_mean``). GRPO is
            always token-mean.
        gate: FlashREINFORCE only: the trust gate on the Bernoulli-KL proxy
            (:func:`agentenv.trainer.objectives.trust_gate`). ``"sequence"`` (default, the method):
            a row is admitted iff ``D_i <= delta``; ``"token"``: each policy token is admitted iff its
            own term ``d_t <= delta`` (denominator still ``T_i``); ``"none"``: every row admitted.
            ``learner/mean_d`` is the mean ``D_i`` in every mode; ``learner/admitted_fraction`` the
            share of rows with an admitted token, ``learner/admitted_token_fraction`` the share of
            policy tokens admitted (``agentenv study gate_under_lag``).
    """

    objective: Literal["flash_reinforce", "grpo"] = "flash_reinforce"
    lr: float = 1e-6
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float = 1.0
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    micro_batch_size: int = 4
    delta: float = 1e-3
    entropy_keep_fraction: float | None = None
    grpo_group_size: int = 8
    grpo_clip_eps: float = 0.2
    step_on_zero_gradient: bool = False
    gradient_checkpointing: bool = False
    share_prefix: bool = True
    max_tokens_per_micro_batch: int | None = None
    logprob_chunk_tokens: int = DEFAULT_CHUNK_TOKENS
    truncation: Literal["keep", "mask", "penalty"] = "keep"
    truncation_penalty: float = 1.0
    advantage_clip_negative: bool = False
    loss_aggregation: Literal["sample_mean", "token_mean"] = "sample_mean"
    gate: Literal["sequence", "token", "none"] = "sequence"

    def __post_init__(self) -> None:
        check_gate(self.gate, "optim.gate")
        if self.loss_aggregation not in ("sample_mean", "token_mean"):
            raise ConfigError(f"optim.loss_aggregation must be 'sample_mean' or 'token_mean', "
                              f"got {self.loss_aggregation!r}")
        if self.truncation not in ("keep", "mask", "penalty"):
            raise ConfigError(f"optim.truncation must be 'keep', 'mask' or 'penalty', got {self.truncation!r}")
        if not (math.isfinite(self.truncation_penalty) and self.truncation_penalty >= 0):
            raise ConfigError(f"optim.truncation_penalty must be a finite number >= 0, got {self.truncation_penalty}")
        if self.objective not in ("flash_reinforce", "grpo"):
            raise ConfigError(f"objective must be 'flash_reinforce' or 'grpo', got {self.objective!r}")
        if not self.lr > 0 or self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ConfigError("lr must be > 0; weight_decay, grad_clip and warmup_steps must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"optim.betas must be two numbers in [0, 1), got {self.betas}")
        if not self.adam_eps > 0:
            raise ConfigError(f"optim.adam_eps must be > 0, got {self.adam_eps}")
        if self.lr_schedule not in SCHEDULES:
            raise ConfigError(f"optim.lr_schedule must be one of {', '.join(SCHEDULES)}; got {self.lr_schedule!r}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"optim.min_lr_ratio (the cosine schedule's final lr / lr) must lie in [0, 1], "
                              f"got {self.min_lr_ratio}")
        if self.micro_batch_size < 1:
            raise ConfigError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")
        if self.max_tokens_per_micro_batch is not None and self.max_tokens_per_micro_batch < 1:
            raise ConfigError(f"optim.max_tokens_per_micro_batch must be >= 1 token (or null: rows only), "
                              f"got {self.max_tokens_per_micro_batch}")
        if self.logprob_chunk_tokens < 1:
            raise ConfigError(f"optim.logprob_chunk_tokens must be >= 1 token per vocabulary projection, "
                              f"got {self.logprob_chunk_tokens}")
        _check_delta(self.delta)
        if self.entropy_keep_fraction is not None:
            _check_fraction(self.entropy_keep_fraction)
        if self.objective == "grpo":
            if self.gate != "sequence":
                raise ConfigError(f"optim.gate {self.gate!r} is FlashREINFORCE's trust gate; GRPO has none "
                                  "(leave optim.gate at 'sequence')")
            if self.truncation == "mask":
                raise ConfigError("optim.truncation 'mask' is defined for FlashREINFORCE's batch baseline only; "
                                  "with grpo use 'keep' or 'penalty'")
            if self.grpo_group_size < 2:
                raise ConfigError(
                    f"GRPO needs grpo_group_size >= 2 (got {self.grpo_group_size}): with n = 1 the group "
                    "baseline makes every advantage 0"
                )
            if not self.grpo_clip_eps > 0:
                raise ConfigError(f"grpo_clip_eps must be > 0, got {self.grpo_clip_eps}")


@dataclass(frozen=True)
class UpdateStats:
    """What one :meth:`Learner.update` did.

    Attributes:
        version: Policy version after the update (optimizer steps so far).
        stepped: Whether an optimizer step was taken (False: zero-gradient batch skipped).
        objective: Summed objective statistics over micro-batches and ranks.
        loss: Full-batch loss value.
        grad_norm: Global gradient L2 norm before clipping (0.0 when not stepped).
        lr: Learning rate used for the step.
        rows: B, rows trained on; excluded_rows: trajectories without policy tokens, dropped.
        reward_mean: Mean episode return over the B rows.
        mean_length: Mean policy tokens per row (tokens).
        mean_sequence_length: Mean tokens per row, prompt and observations included.
        seconds: Wall time of the update (seconds); tokens_per_second: sequence tokens / seconds.
        extra: Backend-specific scalars merged into :meth:`to_metrics` as given.
    """

    version: int
    stepped: bool
    objective: ObjectiveStats
    loss: float
    grad_norm: float
    lr: float
    rows: int
    excluded_rows: int
    reward_mean: float
    mean_length: float
    mean_sequence_length: float
    seconds: float
    tokens_per_second: float
    extra: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, float]:
        """Flat scalars without a prefix (``loss``, ``grad_norm``, ``admitted_fraction``, ...)."""
        return {k.split("/", 1)[-1]: v for k, v in self.to_metrics().items()}

    def to_metrics(self) -> dict[str, float]:
        """A flat dict for :class:`agentenv.trainer.metrics.MetricsWriter` (``train/...`` keys)."""
        o = self.objective
        return {
            "train/version": float(self.version),
            "train/stepped": float(self.stepped),
            "train/loss": self.loss,
            "train/surrogate": o.surrogate_sum,
            "train/grad_norm": self.grad_norm,
            "train/lr": self.lr,
            "train/rows": float(self.rows),
            "train/excluded_rows": float(self.excluded_rows),
            "gate/admitted_fraction": o.admitted_fraction,
            "gate/admitted_token_fraction": o.admitted_token_fraction,
            "gate/mean_d": o.mean_d,
            "gate/mean_rho": o.mean_rho,
            "train/clip_fraction": o.clip_fraction,
            "train/advantage_mean": o.advantage_mean,
            "train/advantage_std": o.advantage_std,
            "train/kept_tokens": float(o.kept_tokens),
            "train/policy_tokens": float(o.tokens),
            "train/behaviour_entropy": o.behaviour_nll_sum / o.tokens if o.tokens else math.nan,
            "train/policy_entropy": o.policy_entropy,
            "reward/mean": self.reward_mean,
            "length/policy_tokens_mean": self.mean_length,
            "length/sequence_tokens_mean": self.mean_sequence_length,
            "perf/update_seconds": self.seconds,
            "perf/tokens_per_second": self.tokens_per_second,
            **self.extra,
        }


#: Shortest shared prefix (tokens) worth a separate forward pass.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(batch: PolicyBatch) -> int:
    """Leading positions every row shares that hold no policy label: the part one KV cache can serve.

    The prefix is the longest run of positions ``0..n-1`` where all rows hold the same real token
    (the system prompt, the tool schemas; a GRPO group's whole prompt), capped so that every label
    position ``j >= n`` is computed in the suffix pass: ``n <= `` the first label position holding
    a policy token in any row (label ``j`` is predicted from position ``j``), and ``n <= L - 1``.

    Returns:
        ``n`` (tokens), 0 for a one-row batch.
    """
    ids, mask = batch.input_ids, batch.attention_mask
    b, length = ids.shape
    if b < 2 or length < 2:
        return 0
    same = (ids == ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    differs = (~same).nonzero()
    n = int(differs[0]) if differs.numel() else length
    policy = batch.loss_mask.any(dim=0).nonzero()
    if policy.numel():
        n = min(n, int(policy[0]))
    return min(n, length - 1)


def token_logprobs(
    model: torch.nn.Module,
    batch: PolicyBatch,
    *,
    with_entropy: bool = False,
    sampling: SamplingTransform | None = None,
    share_prefix: bool = False,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Current log pi(label) at every policy-token label position, and optionally the entropy.

    pi is the policy *as the engine samples from it*: ``sampling`` (the rollout's temperature, top-k
    and top-p) is applied to the logits exactly as the engine did for the behaviour log mu
    (:func:`agentenv.engines.sampling.label_logprobs`), differentiable through the temperature and the
    renormalisation, so the gate and the ratio compare the same distribution. None (the identity:
    temperature 1, no truncation) is plain ``log_softmax``.

    The vocabulary projection runs only at label positions where some row holds a policy token
    (``k`` of the ``t`` positions; ``logits_to_keep`` for a model that takes it). For a transformers
    causal LM whose logits are ``lm_head(hidden)`` (:func:`agentenv.trainer.logprob_chunks.split_head`)
    it runs ``chunk_tokens`` tokens at a time with the logits recomputed in the backward pass
    (:func:`agentenv.trainer.logprob_chunks.chunked_label_logprobs`): no ``(b, k, V)`` float32 tensor
    is ever alive, at most one ``(chunk_tokens, V)`` one.

    With ``share_prefix`` (see :attr:`OptimConfig.share_prefix`), the ``n`` leading tokens all rows
    share (:func:`shared_prefix_length`) run once as a ``(1, n)`` pass whose KV cache is repeated to
    the ``b`` rows, and the rows run only their ``(b, L - n)`` suffixes against it. ``prefix`` gives
    that KV cache ready-made (computed once for a whole batch of which ``batch`` is a subset of
    rows); the gradient then stops at its leaves until :meth:`SharedPrefix.backward`. Either way the
    values and the gradient are the plain pass's up to float rounding (``tests/trainer/test_learner.py``).

    Args:
        model: A causal LM returning ``.logits`` of shape ``(b, L, V)`` (or ``(b, k, V)`` when given
            ``logits_to_keep`` as a ``(k,)`` index tensor); a DeepSpeed engine wrapping one is fine
            (scored by its own forward pass, unchunked).
        batch: The (micro-)batch.
        with_entropy: Also return the entropy (nats) of the processed distribution (full vocabulary
            under the identity), computed without gradient.
        sampling: The behaviour transform; None is the identity.
        share_prefix: Serve the shared prefix from one KV cache when the model allows it.
        chunk_tokens: Tokens per vocabulary projection (> 0); None: one projection of all ``b * k``.
        prefix: The shared prefix's KV cache for ``batch``'s first ``prefix.length`` tokens (all
            before the first policy label), or None.

    Returns:
        ``(logprobs (b, t) float32 nats, entropy (b, t) float32 or None)``. Values at positions without
        a policy token are finite but meaningless (0 where the projection was skipped); the objectives
        mask them with ``loss_mask``.
    """
    b, t = batch.labels.shape
    keep = batch.loss_mask.any(dim=0).nonzero().squeeze(1)
    if prefix is None and share_prefix and keep.numel():
        prefix = shared_prefix(model, batch, leaves=False)
    parts = split_head(model) if chunk_tokens is not None else None
    if parts is not None:
        decoder, head = parts
        if prefix is not None:
            hidden = _suffix_forward(decoder, batch, prefix).last_hidden_state[:, keep - prefix.length]
        else:
            hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                             use_cache=False).last_hidden_state[:, keep]
        lp, ent = chunked_label_logprobs(hidden, head, batch.labels[:, keep], sampling, chunk_tokens,
                                         with_entropy=with_entropy)
    else:
        if prefix is not None:
            logits = _suffix_forward(model, batch, prefix, logits_to_keep=keep - prefix.length).logits
        elif _accepts_logits_to_keep(model) and 0 < keep.numel() < t:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
        else:
            keep = None
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        labels = batch.labels if keep is None else batch.labels[:, keep]
        lp, ent = label_logprobs(logits.float(), labels, sampling, with_entropy=with_entropy)
    if keep is not None:
        lp = lp.new_zeros(b, t).index_copy(1, keep, lp)
        ent = None if ent is None else ent.new_zeros(b, t).index_copy(1, keep, ent)
    return lp, ent


def shared_prefix(model: torch.nn.Module, batch: PolicyBatch, *, leaves: bool) -> SharedPrefix | None:
    """The KV cache of ``batch``'s shared prefix (:func:`shared_prefix_length`), or None.

    None when the model cannot serve rows from a cache (:func:`_can_share_prefix`) or the prefix is
    shorter than :data:`MIN_SHARED_PREFIX` tokens (or the batch has one row). ``leaves``: see
    :class:`agentenv.trainer.shared_prefix.SharedPrefix`.
    """
    if not _can_share_prefix(model):
        return None
    n = shared_prefix_length(batch)
    if n < MIN_SHARED_PREFIX:
        return None
    parts = split_head(model)
    runner = parts[0] if parts is not None else model
    return SharedPrefix(runner, model.config, batch.input_ids[0, :n], leaves=leaves)


def _suffix_forward(model: torch.nn.Module, batch: PolicyBatch, prefix: SharedPrefix, **kw: object) -> object:
    """``model``'s output on the rows' tokens after the prefix (positions ``n..L-1``), served from its cache."""
    from agentenv.engines.kv_cache import cache_keyword

    b, length = batch.input_ids.shape
    n = prefix.length
    positions = torch.arange(n, length, device=batch.input_ids.device).expand(b, -1)
    return model(
        input_ids=batch.input_ids[:, n:], attention_mask=batch.attention_mask, position_ids=positions,
        use_cache=True, **{cache_keyword(model): prefix.cache(b)}, **kw,
    )


def _can_share_prefix(model: torch.nn.Module) -> bool:
    """A transformers causal LM itself (not a wrapper) that keeps a KV cache in this mode."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return False
    if not isinstance(model, PreTrainedModel) or not _accepts_logits_to_keep(model):
        return False
    flag = "is_activation_checkpointing"  # transformers >= 5.x; older releases name it is_gradient_...
    if not hasattr(model, flag):
        flag = "is_gradient_checkpointing"
    return not getattr(model, flag, False)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Turn on non-reentrant activation checkpointing for a transformers model (training mode only).

    Raises:
        ConfigError: The model has no ``gradient_checkpointing_enable`` (not a transformers model).
    """
    inner = getattr(model, "module", model)
    kwargs = {"use_reentrant": False}
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(inner, "gradient_checkpointing_enable"):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(f"optim.gradient_checkpointing needs a transformers model, not {type(inner).__name__}")
    if getattr(inner, "config", None) is not None:
        inner.config.use_cache = False  # a KV cache is useless in a training forward pass


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine wraps) takes a ``logits_to_keep`` argument."""
    inner = getattr(model, "module", model)
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


class Learner:
    """Single-process FlashREINFORCE/GRPO learner for a transformers causal LM.

    Args:
        model: A causal LM (``transformers`` ``PreTrainedModel`` or anything returning ``.logits``).
        config: :class:`OptimConfig`.
        pad_token_id: Pad id for batching (the tokenizer's pad id; never scored).
        version: Starting policy version (a resumed run passes the checkpoint's).
        sampling: The rollout's behaviour transform (temperature, top-p, top-k): log pi is scored under
            it for training and for :meth:`score` alike. None: the identity (temperature 1, no
            truncation), right only when the rollouts sample that way.
        total_steps: The run's optimizer steps (``run.updates``), the horizon of a cosine schedule;
            None is allowed for ``lr_schedule: constant`` only.

    Attributes:
        version: Policy version = optimizer steps taken (including those before a resume).
        optimizer: ``torch.optim.AdamW``; scheduler: ``LambdaLR`` of ``config.lr_schedule``
            (:func:`agentenv.trainer.lr_schedule.build_scheduler`).

    Raises:
        ConfigError: A cosine schedule without ``total_steps > config.warmup_steps``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        config: OptimConfig,
        *,
        pad_token_id: int = 0,
        version: int = 0,
        sampling: SamplingTransform | None = None,
        total_steps: int | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.sampling = sampling if sampling is not None else SamplingTransform()
        self.pad_token_id = pad_token_id
        self.version = version
        if config.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=config.lr, betas=config.betas, eps=config.adam_eps, weight_decay=config.weight_decay
        )
        self.scheduler = build_scheduler(self.optimizer, config, total_steps)
        self._params = params

    # -- scoring ----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def score(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current log pi(a_t) of each trajectory's policy tokens (nats, under ``sampling``), without gradient.

        Used by PACE's prefix drift and as the gate's ``q`` (pass the result to :meth:`update`).
        The result is valid while ``version`` is unchanged; callers may cache it per version.

        Returns:
            One ``(T_i,)`` float32 CPU tensor per trajectory, in order (``(0,)`` for a trajectory with
            no policy token).

        Raises:
            DataError: as :func:`agentenv.trainer.batching.build_batch`, or a non-finite current
                log-probability at a policy token (names the trajectory).
        """
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[torch.Tensor] = [torch.zeros(0) for _ in trajectories]
            batch = build_batch(trajectories, self.pad_token_id)
            for mb in split_micro_batches(batch, self.config.micro_batch_size):
                mb = mb.to(self.device)
                lp, _ = token_logprobs(self.model, mb, sampling=self.sampling, share_prefix=self.config.share_prefix,
                                       chunk_tokens=self.config.logprob_chunk_tokens)
                for i, (tid, k) in enumerate(zip(mb.ids, mb.source_index, strict=True)):
                    row = lp[i][mb.loss_mask[i]].float().cpu()
                    if not torch.isfinite(row).all():
                        raise DataError(f"trajectory {tid}: non-finite current log-probability")
                    out[k] = row
        finally:
            self.model.train(was_training)
        return out

    # -- gradients --------------------------------------------------------------------------------
    def prepare(
        self, trajectories: Sequence[Trajectory], scores: Sequence[torch.Tensor] | None = None
    ) -> tuple[PolicyBatch, torch.Tensor | None]:
        """Build the padded batch, its global advantages and (with ``scores``) the gate decision.

        Returns:
            ``(batch, admitted)``: ``admitted`` is ``(B,)`` bool from the scores, or None.

        Raises:
            DataError: empty batch, malformed trajectory, scores not matching the trajectories.
            ConfigError: GRPO with a batch that is not whole groups.
        """
        return prepare_batch(trajectories, scores, self.config, self.pad_token_id)

    def backward(
        self, batch: PolicyBatch, admitted: torch.Tensor | None = None,
        log_ratios: list[torch.Tensor] | None = None,
    ) -> ObjectiveStats:
        """Accumulate this rank's share of the full-batch gradient into ``.grad`` (no step, no reduce).

        Rows are processed in micro-batches of at most ``config.micro_batch_size`` rows and, when
        set, ``config.max_tokens_per_micro_batch`` padded tokens (:func:`micro_batch_rows`); the
        prefix every row shares runs once before them (``config.share_prefix``) and its gradient is
        back-propagated once after them. The objective uses the global B, T_i and N, so the
        accumulated gradient does not depend on the split. glibc's free heap is returned to the
        operating system before the first micro-batch (:func:`agentenv.malloc.release_free_heap`).

        Args:
            batch: From :meth:`prepare` (advantages filled).
            admitted: ``(B,)`` precomputed gate decision, or None to gate on the training forward.
            log_ratios: When given, receives each forward micro-batch's ``log pi - log mu`` at its
                policy tokens (a 1-d float32 CPU tensor each; skipped micro-batches add none).

        Returns:
            This rank's summed :class:`ObjectiveStats`.
        """
        cfg = self.config
        rank, world = _rank_world()
        mine = shard(batch, rank, world) if world > 1 else batch
        stats = ObjectiveStats()
        if mine is None:
            return stats
        offset = _shard_offset(batch.num_rows, rank, world)
        adm_mine = admitted[offset : offset + mine.num_rows] if admitted is not None else None
        release_free_heap()  # freed blocks of the last step leave the process before this one's activations
        prefix = shared_prefix(self.model, mine, leaves=True) if cfg.share_prefix else None
        n = prefix.length if prefix is not None else 0
        for rows in micro_batch_rows(mine, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, n):
            mb = mine.select(rows)
            adm = adm_mine[torch.as_tensor(rows)] if adm_mine is not None else None
            if adm is not None and not bool((adm & (mb.advantages != 0)).any()):
                # No row here carries gradient: skip the forward, keep the bookkeeping.
                stats = stats + _skipped_stats(mb, adm)
                continue
            mb = mb.to(self.device)
            lp, ent = token_logprobs(self.model, mb, with_entropy=True, sampling=self.sampling,
                                     chunk_tokens=cfg.logprob_chunk_tokens, prefix=prefix)
            if log_ratios is not None:
                log_ratios.append(policy_log_ratios(lp, mb))
            out = micro_batch_objective(lp, ent, mb, batch, cfg, adm)
            if out.loss.requires_grad:
                out.loss.backward()
            stats = stats + out.stats
            del lp, ent, out
        if prefix is not None:
            prefix.backward()  # the prefix's gradient, summed over every micro-batch, through its one pass
        return stats

    # -- the step ---------------------------------------------------------------------------------
    def update(
        self, trajectories: Sequence[Trajectory], *, scores: Sequence[torch.Tensor] | None = None
    ) -> UpdateStats:
        """One optimizer step on a fresh batch (then the batch is discarded), and ``version += 1``.

        Args:
            trajectories: The fresh batch (B rows; each rank passes the same list under
                torch.distributed).
            scores: Optional output of :meth:`score` for these trajectories under the current
                weights (one ``(T_i,)`` tensor per trajectory, in order); when given, the
                FlashREINFORCE gate uses it as ``q`` (the same q PACE's drift used) and micro-batches
                with no admitted row of nonzero advantage skip their forward pass. GRPO ignores it.
                A batch in which every advantage is 0 runs no forward pass at all (no gradient can
                come from it whatever the policy); its gate statistics are then not measured
                (``gate/mean_d`` is NaN).

        Returns:
            :class:`UpdateStats`. ``stepped`` is False (and the version unchanged) when the batch
            carried no gradient and ``config.step_on_zero_gradient`` is False.

        Raises:
            DataError: empty batch, malformed trajectory, NaN/inf or positive log-probability at a
                policy token (the message names the trajectory id). The model and optimizer are
                untouched when this is raised (gradients are cleared).
        """
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        log_ratios: list[torch.Tensor] = []
        try:
            batch, admitted = self.prepare(trajectories, scores)
            if bool((batch.advantages != 0).any()):
                stats = self.backward(batch, admitted, log_ratios)
            else:  # every advantage 0: no gradient whatever the policy, so no forward pass
                stats = unscored_stats(batch) if _rank_world()[0] == 0 else ObjectiveStats()
        except Exception:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        stats = _all_reduce_stats(stats)
        stats = _with_excluded(stats, batch.excluded_rows)
        has_signal = stats.kept_tokens > 0 and any(
            p.grad is not None and bool(p.grad.any()) for p in self._params
        )
        has_signal = _all_reduce_flag(has_signal)
        _all_reduce_grads(self._params)
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = 0.0
        stepped = has_signal or self.config.step_on_zero_gradient
        if stepped:
            norm = torch.nn.utils.clip_grad_norm_(
                self._params, self.config.grad_clip if self.config.grad_clip > 0 else math.inf
            )
            grad_norm = float(norm)
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise DataError(f"non-finite gradient norm {grad_norm}; batch {list(batch.ids)[:4]} skipped")
            self.optimizer.step()
            self.scheduler.step()
            self.version += 1
        else:
            log.info(
                "update skipped at version %d: no gradient (admitted %d/%d rows, advantage std %.3g)",
                self.version, stats.admitted, stats.rows, stats.advantage_std,
            )
        self.optimizer.zero_grad(set_to_none=True)
        return update_stats(batch, stats, version=self.version, stepped=stepped, grad_norm=grad_norm, lr=lr,
                            seconds=time.perf_counter() - t0, extra=ratio_tail(log_ratios))

    # -- checkpoints ------------------------------------------------------------------------------
    def save(
        self, root: Path | str, *, pool_state: dict | None = None, extra: dict | None = None, keep: int = 2
    ) -> Path:
        """Checkpoint model, optimizer, scheduler, version, pool state and RNG states atomically.

        See :func:`agentenv.trainer.checkpoint.save_checkpoint` (raises ``CheckpointError``).
        """
        from agentenv.trainer.checkpoint import save_checkpoint

        return save_checkpoint(
            root, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, version=self.version,
            pool_state=pool_state, extra=extra, keep=keep,
        )

    def restore(self, path: Path | str) -> LoadedCheckpoint:
        """Resume from a checkpoint folder or root; the version numbering continues from it.

        The optimizer's moments and the schedule's step count come from the checkpoint; the lr,
        betas, eps and weight decay are this learner's config (a change is logged as a warning).
        See :func:`agentenv.trainer.checkpoint.load_checkpoint` (raises ``CheckpointError`` and then
        leaves the learner unchanged).
        """
        from agentenv.trainer.checkpoint import load_checkpoint

        loaded = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        self.version = loaded.version
        log_applied(apply_optim_settings(self.optimizer, self.scheduler, self.config))
        return loaded

    # -- weights ----------------------------------------------------------------------------------
    def weights_for_engine(self, path: Path | str | None = None) -> dict[str, torch.Tensor] | Path:
        """The current weights for ``engine.update_weights(weights, learner.version)``.

        Args:
            path: None returns a detached CPU copy of the state dict (safe to hand to another thread
                while training continues); a path writes a safetensors file there (atomically: a
                temporary file in the same folder, then rename) and returns the path (vLLM loads
                files, not tensors).

        Tied tensors (``lm_head.weight`` sharing ``model.embed_tokens.weight``) are copied once: in
        the state dict every name of a tied group maps to that one copy; the file holds the first
        name only (what :func:`agentenv.engines.weights.check_state_dict` needs).

        Returns:
            The state dict or the file path.
        """
        sd: dict[str, torch.Tensor] = {}
        copies: dict[tuple, str] = {}  # (address, shape, strides) of a model tensor -> its first name
        for k, v in self.model.state_dict().items():
            where = (v.device, v.data_ptr(), tuple(v.shape), v.stride())
            first = copies.setdefault(where, k)
            sd[k] = sd[first] if first != k else v.detach().to("cpu", copy=True).contiguous()
        if path is None:
            return sd
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        save_file({k: sd[k] for k in copies.values()}, str(tmp), metadata={"version": str(self.version)})
        tmp.replace(path)
        return path


# -- shared by the learners (this one and agentenv.trainer.openrlhf_backend) ---------------------------
def prepare_batch(
    trajectories: Sequence[Trajectory], scores: Sequence[torch.Tensor] | None, config: OptimConfig,
    pad_token_id: int,
) -> tuple[PolicyBatch, torch.Tensor | None]:
    """Padded batch with its global advantages and, given ``scores``, FlashREINFORCE's gate decision.

    Args:
        trajectories: The fresh batch (B trajectories).
        scores: Current log pi(a_t) per trajectory (one ``(T_i,)`` tensor or array each, in order), the
            gate's ``q``; None leaves the gate to the training forward. GRPO ignores them.
        config: Objective settings (``objective``, ``grpo_group_size``, ``delta``, ``gate``).
        pad_token_id: Pad id.

    Trajectories cut by a token budget are treated as ``config.truncation`` says (:class:`OptimConfig`).

    Returns:
        ``(batch, admitted)``: advantages ``A_i = R_i - mean R`` over all B rows (GRPO: per group;
        ``max(A_i, 0)`` under ``config.advantage_clip_negative``);
        ``admitted`` is ``(B,)`` bool from the scores (rows that keep any gradient under
        ``config.gate``), or None; the tokens' decision ``m_it`` goes in ``batch.gate_mask``.

    Raises:
        DataError: empty batch, malformed trajectory, scores not matching the trajectories.
        ConfigError: GRPO with a batch that is not whole groups.
    """
    batch = build_batch(trajectories, pad_token_id)
    cut = torch.tensor([is_token_budget_cut(trajectories[k]) for k in batch.source_index], dtype=torch.bool)
    rewards = batch.rewards
    if config.truncation == "penalty":
        rewards = rewards - config.truncation_penalty * cut.float()
    if config.objective == "grpo":
        adv = group_advantages(rewards, config.grpo_group_size)
    elif config.truncation == "mask":
        adv = masked_batch_mean_advantages(rewards, ~cut)
    else:
        adv = batch_mean_advantages(rewards)
    failed = adv < 0  # before the clamp below: the entropy filter's failed rows stay failed
    if config.advantage_clip_negative:  # A = max(A, 0): no negative feedback (OptimConfig)
        adv = adv.clamp(min=0.0)
    batch = replace(batch, advantages=adv.float(), failed=failed)
    admitted = None
    if scores is not None and config.objective == "flash_reinforce":
        if len(scores) != len(trajectories):
            raise DataError(f"{len(scores)} score tensors for {len(trajectories)} trajectories")
        q = torch.zeros_like(batch.behaviour_logprobs)
        for i, (tid, k) in enumerate(zip(batch.ids, batch.source_index, strict=True)):
            s = torch.as_tensor(scores[k]).float().reshape(-1)
            if s.numel() != int(batch.lengths[i]):
                raise DataError(
                    f"trajectory {tid}: {s.numel()} scores for {int(batch.lengths[i])} policy tokens"
                )
            q[i][batch.loss_mask[i]] = s
        decision = trust_gate(q, batch.behaviour_logprobs, batch.loss_mask, config.delta, config.gate)
        admitted = decision.rows
        batch = replace(batch, gate_d=decision.d.float(), gate_mask=decision.tokens)
    return batch, admitted


def update_stats(
    batch: PolicyBatch, stats: ObjectiveStats, *, version: int, stepped: bool, grad_norm: float, lr: float,
    seconds: float, extra: dict[str, float] | None = None,
) -> UpdateStats:
    """The :class:`UpdateStats` of one update on ``batch`` (lengths in tokens, ``seconds`` wall time)."""
    seq_tokens = int(batch.attention_mask.sum())
    return UpdateStats(
        version=version,
        stepped=stepped,
        objective=stats,
        loss=stats.loss_sum,
        grad_norm=grad_norm,
        lr=lr,
        rows=batch.num_rows,
        excluded_rows=batch.excluded_rows,
        reward_mean=float(batch.rewards.mean()),
        mean_length=float(batch.lengths.float().mean()),
        mean_sequence_length=seq_tokens / batch.num_rows,
        seconds=seconds,
        tokens_per_second=seq_tokens / seconds if seconds > 0 else math.nan,
        extra=dict(extra or {}),
    )


def micro_batch_objective(
    logprobs: torch.Tensor, entropies: torch.Tensor, mb: PolicyBatch, batch: PolicyBatch, config: OptimConfig,
    admitted: torch.Tensor | None,
) -> ObjectiveOutput:
    """The objective's loss and statistics on one scored micro-batch: the micro-step every learner backend runs.

    FlashREINFORCE (:func:`agentenv.trainer.objectives.flash_reinforce_loss`) or GRPO
    (:func:`agentenv.trainer.objectives.grpo_loss`) per ``config.objective``, with the global
    denominators of ``batch`` (B, the policy-token count N), so micro-batch losses add up to the
    full-batch loss. The statistics also carry the exact entropy of pi_theta over ``mb``'s policy
    tokens (``entropy_sum``, ``entropy_tokens``).

    Args:
        logprobs: ``(b, t)`` log pi_theta from :func:`token_logprobs`, with gradient (b: ``mb``'s rows).
        entropies: ``(b, t)`` entropy of pi_theta under the sampling transform (nats), no gradient.
        mb: The micro-batch (rows of ``batch``), on the logprobs' device.
        batch: The whole (global) batch the micro-batch comes from.
        config: The objective's settings.
        admitted: ``(b,)`` bool precomputed gate decision for ``mb``'s rows, or None to gate on
            ``logprobs`` (FlashREINFORCE; GRPO ignores it).

    Returns:
        :class:`ObjectiveOutput`; call ``loss.backward()`` (scaled as the backend needs) when it
        requires grad.
    """
    if config.objective == "grpo":
        out = grpo_loss(
            logprobs, mb.behaviour_logprobs, mb.loss_mask, mb.advantages, mb.lengths, batch.global_tokens,
            clip_eps=config.grpo_clip_eps, row_ids=mb.ids,
        )
    else:
        out = flash_reinforce_loss(
            logprobs, mb.behaviour_logprobs, mb.loss_mask, mb.advantages, mb.lengths,
            batch.global_batch_size, delta=config.delta,
            admitted=admitted.to(logprobs.device) if admitted is not None else None, gate_d=mb.gate_d,
            entropies=entropies, entropy_keep_fraction=config.entropy_keep_fraction, failed=mb.failed,
            row_ids=mb.ids,
            total_tokens=batch.global_tokens if config.loss_aggregation == "token_mean" else None,
            gate=config.gate, token_admitted=mb.gate_mask if admitted is not None else None,
        )
    mask = mb.loss_mask.to(entropies.device)
    stats = replace(out.stats, entropy_sum=float(entropies.detach()[mask].double().sum()),
                    entropy_tokens=int(mask.sum()))
    return replace(out, stats=stats)


def policy_log_ratios(logprobs: torch.Tensor, batch: PolicyBatch) -> torch.Tensor:
    """``log pi - log mu`` at the policy tokens of ``batch`` (nats), a detached 1-d float32 CPU tensor.

    Args:
        logprobs: ``(b, t)`` current log pi from :func:`token_logprobs`.
        batch: The (micro-)batch they were computed on.
    """
    mask = batch.loss_mask.to(logprobs.device)
    return (logprobs.detach().float() - batch.behaviour_logprobs.to(logprobs.device))[mask].cpu()


def ratio_tail(log_ratios: Sequence[torch.Tensor]) -> dict[str, float]:
    """The tail of the importance ratio ``rho = pi / mu`` over the given policy tokens.

    Returns:
        ``{"gate/rho_p99": ..., "gate/rho_max": ..., "gate/rho_min": ...}`` (ratios, not logs; the
        99th percentile by linear interpolation), or ``{}`` when no token was scored (a skipped or
        zero-advantage batch).
    """
    values = torch.cat(list(log_ratios)) if log_ratios else torch.zeros(0)
    if values.numel() == 0:
        return {}
    values = values.double()
    return {
        "gate/rho_p99": float(torch.quantile(values, 0.99).exp()),
        "gate/rho_max": float(values.max().exp()),
        "gate/rho_min": float(values.min().exp()),
    }


def unscored_stats(batch: PolicyBatch) -> ObjectiveStats:
    """The statistics of a batch that ran no forward pass: counts, advantages and behaviour only.

    The gate was not evaluated, so ``d_sum`` is NaN (``gate/mean_d`` logs NaN) and no row counts as
    admitted; no token carries gradient.
    """
    adv = batch.advantages.double()
    return ObjectiveStats(
        rows=batch.num_rows,
        tokens=int(batch.lengths.sum()),
        d_sum=math.nan,
        adv_sum=float(adv.sum()),
        adv_sq_sum=float((adv * adv).sum()),
        behaviour_nll_sum=float(-batch.behaviour_logprobs[batch.loss_mask].double().sum()),
    )


# -- helpers ---------------------------------------------------------------------------------------
def _replace_adv(batch: PolicyBatch, adv: torch.Tensor) -> PolicyBatch:
    return replace(batch, advantages=adv)


def _skipped_stats(mb: PolicyBatch, adm: torch.Tensor) -> ObjectiveStats:
    adv = mb.advantages.double()
    return ObjectiveStats(
        rows=mb.num_rows,
        admitted=int(adm.sum()),
        admitted_tokens=int((mb.gate_mask & mb.loss_mask & adm.unsqueeze(1)).sum()),
        tokens=int(mb.lengths.sum()),
        d_sum=float(mb.gate_d.double().sum()),
        adv_sum=float(adv.sum()),
        adv_sq_sum=float((adv * adv).sum()),
        behaviour_nll_sum=float(-mb.behaviour_logprobs[mb.loss_mask].double().sum()),
    )


def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _shard_offset(rows: int, rank: int, world: int) -> int:
    per, extra = divmod(rows, world)
    return rank * per + min(rank, extra)


def _all_reduce_grads(params: Sequence[torch.Tensor]) -> None:
    """SUM the partial gradients over ranks (denominators are global, so no averaging)."""
    _, world = _rank_world()
    if world == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)


def _all_reduce_flag(flag: bool) -> bool:
    _, world = _rank_world()
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)


_SUM_FIELDS = (
    "rows", "admitted", "admitted_tokens", "tokens", "kept_tokens", "d_sum", "rho_sum", "adv_sum", "adv_sq_sum",
    "loss_sum", "surrogate_sum", "clipped_tokens", "behaviour_nll_sum", "entropy_sum", "entropy_tokens",
)


def _all_reduce_stats(stats: ObjectiveStats) -> ObjectiveStats:
    _, world = _rank_world()
    if world == 1:
        return stats
    t = torch.tensor([float(getattr(stats, f)) for f in _SUM_FIELDS], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    vals = {
        f: (int(round(v)) if isinstance(getattr(stats, f), int) else v)
        for f, v in zip(_SUM_FIELDS, t.tolist(), strict=True)
    }
    return ObjectiveStats(**vals)


def _with_excluded(stats: ObjectiveStats, excluded: int) -> ObjectiveStats:
    return replace(stats, excluded_rows=excluded)
