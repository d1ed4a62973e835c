"""One update's pieces that every learner backend shares: the batch, the micro-step, the statistics.

:func:`prepare_batch` pads the fresh batch and computes its global advantages and the gate's
decision; :func:`micro_batch_objective` is the micro-step's loss (FlashREINFORCE or GRPO with the
global denominators); :func:`update_stats` assembles the :class:`UpdateStats` an update returns.
The single-process :class:`agentenv.trainer.learners.single.Learner` and the DeepSpeed
:class:`agentenv.trainer.learners.openrlhf.OpenRLHFLearner` differ only in how they run the
micro-steps and step the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.episode import is_token_budget_cut
from agentenv.trainer.advantages import batch_mean_advantages, group_advantages, masked_batch_mean_advantages
from agentenv.trainer.batching import PolicyBatch, build_batch
from agentenv.trainer.learners.config import TRUNCATION_PENALTY
from agentenv.trainer.objectives import (
    RHO_LOG_CLAMP,
    ObjectiveOutput,
    ObjectiveStats,
    check_loss_constant,
    flash_reinforce_loss,
    grpo_loss,
)
from agentenv.trainer.trust_gate import trust_gate
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.trainer.learners.config import ObjectiveConfig

__all__ = [
    "UpdateStats",
    "check_objective_constant",
    "micro_batch_objective",
    "policy_log_ratios",
    "prepare_batch",
    "ratio_tail",
    "skipped_stats",
    "unscored_stats",
    "update_stats",
]


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


def prepare_batch(
    trajectories: Sequence[Trajectory], scores: Sequence[torch.Tensor] | None, config: ObjectiveConfig,
    pad_token_id: int,
) -> tuple[PolicyBatch, torch.Tensor | None]:
    """Padded batch with its global advantages and, given ``scores``, FlashREINFORCE's gate decision.

    Args:
        trajectories: The fresh batch (B trajectories).
        scores: Current log pi(a_t) per trajectory (one ``(T_i,)`` tensor or array each, in order), the
            gate's ``q``; None leaves the gate to the training forward. GRPO ignores them.
        config: The objective (``name``, ``grpo_group_size``, ``delta``, ``gate``, ...).
        pad_token_id: Pad id.

    Trajectories cut by a token budget are treated as ``config.truncation`` says (:class:`ObjectiveConfig`).

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
        rewards = rewards - TRUNCATION_PENALTY * cut.float()
    if config.name == "grpo":
        adv = group_advantages(rewards, config.grpo_group_size)
    elif config.truncation == "mask":
        adv = masked_batch_mean_advantages(rewards, ~cut)
    else:
        adv = batch_mean_advantages(rewards)
    failed = adv < 0  # before the clamp below: the entropy filter's failed rows stay failed
    if config.advantage_clip_negative:  # A = max(A, 0): no negative feedback (ObjectiveConfig)
        adv = adv.clamp(min=0.0)
    batch = replace(batch, advantages=adv.float(), failed=failed)
    admitted = None
    if scores is not None and config.name == "flash_reinforce":
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


def check_objective_constant(config: ObjectiveConfig, loss_constant: float | None) -> float | None:
    """``loss_constant`` when it fits ``config.loss_aggregation``: given (> 0) for ``"constant"``, None otherwise.

    Every learner backend checks its ``loss_constant`` argument with this when it is built.

    Raises:
        ConfigError: ``"constant"`` without a constant (the trainer passes the rollout's policy-token
            budget, :func:`agentenv.trainer.learners.backends.loss_constant`), a constant that is not a
            finite number > 0, or a constant with another aggregation.
    """
    if config.loss_aggregation == "constant" and loss_constant is None:
        raise ConfigError("objective.loss_aggregation=constant needs the learner's loss_constant K (policy tokens); "
                          "the trainer passes the rollout's policy-token budget (learners.backends.loss_constant)")
    if config.loss_aggregation != "constant" and loss_constant is not None:
        raise ConfigError(f"loss_constant={loss_constant} is the normaliser of objective.loss_aggregation=constant, "
                          f"not of {config.loss_aggregation!r}")
    check_loss_constant(loss_constant)
    return loss_constant


def micro_batch_objective(
    logprobs: torch.Tensor, entropies: torch.Tensor, mb: PolicyBatch, batch: PolicyBatch, config: ObjectiveConfig,
    admitted: torch.Tensor | None, *, loss_constant: float | None = None,
) -> ObjectiveOutput:
    """The objective's loss and statistics on one scored micro-batch: the micro-step every learner backend runs.

    FlashREINFORCE (:func:`agentenv.trainer.objectives.flash_reinforce_loss`) or GRPO
    (:func:`agentenv.trainer.objectives.grpo_loss`) per ``config.name``, with the global
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
        loss_constant: ``K`` under ``config.loss_aggregation: constant`` (policy tokens), else None.

    Returns:
        :class:`ObjectiveOutput`; call ``loss.backward()`` (scaled as the backend needs) when it
        requires grad.

    Raises:
        ConfigError: ``loss_constant`` does not fit the aggregation (:func:`check_objective_constant`).
    """
    check_objective_constant(config, loss_constant)
    if config.name == "grpo":
        out = grpo_loss(
            logprobs, mb.behaviour_logprobs, mb.loss_mask, mb.advantages, mb.lengths, batch.global_tokens,
            row_ids=mb.ids,
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
            is_truncation=config.is_truncation, loss_constant=loss_constant,
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


def ratio_tail(log_ratios: Sequence[torch.Tensor], is_truncation: float | None = None) -> dict[str, float]:
    """The tail of the importance ratio ``rho = pi / mu`` over the given policy tokens.

    Args:
        log_ratios: ``log pi - log mu`` per scored policy token (nats; 1-d tensors, from
            :func:`policy_log_ratios`).
        is_truncation: ``objective.is_truncation`` (C), or None: with C, also the share of these tokens
            whose ratio the loss truncated, ``rho > C`` with ``rho = exp(clamp(log ratio, -30, 30))``
            as in the loss.

    Returns:
        ``{"gate/rho_p99": ..., "gate/rho_max": ..., "gate/rho_min": ...}`` (ratios, not logs, before
        truncation; the 99th percentile by linear interpolation) and, with ``is_truncation``,
        ``"gate/rho_truncated_fraction"`` (in [0, 1]); ``{}`` when no token was scored (a skipped or
        zero-advantage batch).
    """
    values = torch.cat(list(log_ratios)) if log_ratios else torch.zeros(0)
    if values.numel() == 0:
        return {}
    values = values.double()
    tail = {
        "gate/rho_p99": float(torch.quantile(values, 0.99).exp()),
        "gate/rho_max": float(values.max().exp()),
        "gate/rho_min": float(values.min().exp()),
    }
    if is_truncation is not None:
        rho = values.clamp(-RHO_LOG_CLAMP, RHO_LOG_CLAMP).exp()
        tail["gate/rho_truncated_fraction"] = float((rho > is_truncation).double().mean())
    return tail


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


def skipped_stats(mb: PolicyBatch, adm: torch.Tensor) -> ObjectiveStats:
    """The statistics of a micro-batch whose forward pass was skipped (no admitted row carries gradient)."""
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
