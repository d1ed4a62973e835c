"""Advantages from a batch's rewards: FlashREINFORCE's batch-mean baseline and GRPO's group baseline.

Compute them on the whole fresh batch (``B`` rows), before any micro-batch or rank split; the
objectives (:mod:`agentenv.trainer.objectives`) take them per row.
"""

from __future__ import annotations

import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.work_dtype import as_work_float

__all__ = ["batch_mean_advantages", "group_advantages", "masked_batch_mean_advantages"]


def batch_mean_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """FlashREINFORCE advantages ``A_i = R_i - mean_j R_j`` over all B rows (no std division).

    Compute them on the whole fresh batch, before any micro-batch or rank split.

    Args:
        rewards: ``(B,)`` episode returns.

    Returns:
        ``(B,)`` advantages, float32 at least.

    Raises:
        DataError: empty batch or a non-finite reward.
    """
    r = as_work_float(rewards.reshape(-1))
    if r.numel() == 0:
        raise DataError("cannot compute advantages of an empty batch")
    if not torch.isfinite(r).all():
        raise DataError(f"non-finite reward at rows {torch.nonzero(~torch.isfinite(r)).flatten().tolist()}")
    return r - r.mean()


def masked_batch_mean_advantages(rewards: torch.Tensor, included: torch.Tensor) -> torch.Tensor:
    """``A_i = R_i - mean_{j included} R_j`` for included rows, 0 for the others (no std division).

    The batch-mean baseline of :func:`batch_mean_advantages` over a subset: rows left out (e.g.
    trajectories cut by a token budget under DAPO-style overlong filtering) neither shape the
    baseline nor receive an advantage. With every row included it equals :func:`batch_mean_advantages`.

    Args:
        rewards: ``(B,)`` episode returns.
        included: ``(B,)`` bool, rows that take part.

    Returns:
        ``(B,)`` advantages, float32 at least (all 0 when no row is included).

    Raises:
        DataError: empty batch, a non-finite reward, or ``included`` of another length.
    """
    r = as_work_float(rewards.reshape(-1))
    keep = included.reshape(-1).to(device=r.device, dtype=torch.bool)
    if keep.numel() != r.numel():
        raise DataError(f"included has {keep.numel()} rows for {r.numel()} rewards")
    if not bool(keep.any()):
        if r.numel() == 0:
            raise DataError("cannot compute advantages of an empty batch")
        return torch.zeros_like(r)
    adv = batch_mean_advantages(r[keep])
    return torch.zeros_like(r).masked_scatter(keep, adv)


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-6) -> torch.Tensor:
    """GRPO group-normalised advantages ``(r - mean_g) / (std_g + eps)`` (arXiv 2402.03300, sec. 4.1.2).

    Rows are grouped contiguously: rows ``[k*n, (k+1)*n)`` are the ``n`` samples of prompt ``k``.
    ``std_g`` is the unbiased (Bessel-corrected) sample standard deviation, as in TRL and OpenRLHF.

    Args:
        rewards: ``(B,)`` episode returns, ``B = G * n``.
        group_size: ``n`` samples per prompt.
        eps: Added to the standard deviation (reward units).

    Returns:
        ``(B,)`` advantages, float32 at least.

    Raises:
        ConfigError: ``group_size < 2`` (every advantage would be 0).
        DataError: empty batch, non-finite reward, or ``B`` not a multiple of ``group_size``.
    """
    if group_size < 2:
        raise ConfigError(
            f"group baseline needs group_size >= 2 (got {group_size}): with n = 1 every advantage is 0"
        )
    r = as_work_float(rewards.reshape(-1))
    if r.numel() == 0:
        raise DataError("cannot compute advantages of an empty batch")
    if not torch.isfinite(r).all():
        raise DataError(f"non-finite reward at rows {torch.nonzero(~torch.isfinite(r)).flatten().tolist()}")
    if r.numel() % group_size:
        raise DataError(f"batch of {r.numel()} rows is not a whole number of groups of {group_size}")
    g = r.view(-1, group_size)
    return ((g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + eps)).reshape(-1)
