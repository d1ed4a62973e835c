"""Trajectories -> padded tensors for the learner, and splits that keep the global denominators.

Tensor legend:

* ``b``: rows (trajectories) in a batch or micro-batch; ``B`` rows in the whole fresh batch.
* ``L``: padded sequence length in tokens (right padding); ``t = L - 1`` label positions.

Label alignment: the model's logits at position ``j`` predict token ``j + 1``, so every per-token
training tensor is indexed by *label position* ``j`` in ``[0, L - 1)`` and describes token
``j + 1``: ``labels[:, j] = input_ids[:, j + 1]``, ``loss_mask[:, j] = trajectory.loss_mask[j + 1]``,
``behaviour_logprobs[:, j] = trajectory.behaviour_logprobs[j + 1]``. A trajectory's first token has
no label position, so it must not be a policy token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from agentenv.errors import DataError
from agentenv.trajectory import Trajectory

__all__ = ["PolicyBatch", "build_batch", "micro_batch_rows", "shard", "shard_offset", "split_micro_batches"]


@dataclass(frozen=True)
class PolicyBatch:
    """A padded batch of trajectories, ready for a forward pass and an objective.

    Attributes:
        input_ids: ``(b, L)`` long token ids, right-padded with the pad id.
        attention_mask: ``(b, L)`` long, 1 at real tokens.
        labels: ``(b, t)`` long, ``input_ids[:, 1:]`` (pad id at padding).
        loss_mask: ``(b, t)`` bool, True at label positions holding a policy token.
        behaviour_logprobs: ``(b, t)`` float32 sampler log-probabilities (nats) at label positions; 0
            elsewhere.
        rewards: ``(b,)`` float32 episode returns.
        lengths: ``(b,)`` long, T_i = policy tokens of each row (the per-row denominator).
        advantages: ``(b,)`` float32, filled by the learner over the *global* batch (zeros until then).
        gate_d: ``(b,)`` float32, FlashREINFORCE's gate statistic D_i (nats) when the gate was decided
            from a scoring pass before the training forward (zeros until then; see
            :func:`agentenv.trainer.learners.update_step.prepare_batch`).
        gate_mask: ``(b, t)`` bool, the gate's token decision ``m_it`` when it was decided from a
            scoring pass (``objective.gate``: sequence, the admitted rows' policy tokens; token, each
            token's own; none, ``loss_mask``); a copy of ``loss_mask`` until then.
        failed: ``(b,)`` bool, the rows FlashREINFORCE's entropy filter treats as failed: advantage
            below 0 *before* any clipping (``objective.advantage_clip_negative``), filled by the learner
            with the advantages (all False until then).
        ids: The trajectories' ids, row order.
        global_batch_size: B, rows in the whole fresh batch (kept by every split).
        global_tokens: N, policy tokens in the whole fresh batch (kept by every split).
        excluded_rows: Trajectories dropped because they had no policy token.
        source_index: Each row's position in the list given to :func:`build_batch` (ids need not be
            unique).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    behaviour_logprobs: torch.Tensor
    rewards: torch.Tensor
    lengths: torch.Tensor
    advantages: torch.Tensor
    gate_d: torch.Tensor
    gate_mask: torch.Tensor
    failed: torch.Tensor
    ids: tuple[str, ...]
    global_batch_size: int
    global_tokens: int
    excluded_rows: int = 0
    source_index: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        """b, rows in this (micro-)batch."""
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> PolicyBatch:
        """A copy with every tensor on ``device``."""
        return replace(
            self,
            **{k: getattr(self, k).to(device) for k in _ROW_TENSORS},
        )

    def select(self, rows: Sequence[int] | slice) -> PolicyBatch:
        """Rows ``rows`` as a new batch, padding trimmed to their longest row; B and N are kept."""
        idx = (
            torch.arange(self.num_rows)[rows]
            if isinstance(rows, slice)
            else torch.as_tensor(list(rows), dtype=torch.long)
        )
        if idx.numel() == 0:
            raise DataError("cannot select zero rows of a batch")
        keep_len = int(self.attention_mask[idx].sum(dim=1).max())
        out = {}
        for k in _ROW_TENSORS:
            x = getattr(self, k)[idx]
            if k in ("input_ids", "attention_mask"):
                x = x[:, :keep_len]
            elif x.dim() == 2:
                x = x[:, : max(keep_len - 1, 0)]
            out[k] = x
        ids = tuple(self.ids[int(i)] for i in idx)
        src = tuple(self.source_index[int(i)] for i in idx) if self.source_index else ()
        return replace(self, ids=ids, source_index=src, **out)


_ROW_TENSORS = (
    "input_ids",
    "attention_mask",
    "labels",
    "loss_mask",
    "behaviour_logprobs",
    "rewards",
    "lengths",
    "advantages",
    "gate_d",
    "gate_mask",
    "failed",
)


def build_batch(trajectories: Sequence[Trajectory], pad_token_id: int = 0) -> PolicyBatch:
    """Pad trajectories into a :class:`PolicyBatch` (label-aligned, see the module docstring).

    Trajectories with no policy token are excluded and counted in ``excluded_rows``; B and N count
    the remaining rows.

    Args:
        trajectories: The fresh batch, in the order the pool gave it.
        pad_token_id: Id used to pad ``input_ids`` and ``labels`` (never attended to or scored).

    Returns:
        The padded batch (CPU tensors).

    Raises:
        DataError: an empty batch (or one where no trajectory has a policy token), per-token lists of
            different lengths, a policy token at position 0, or a non-finite or positive (> 1e-6)
            behaviour log-probability at a policy token. The message names the trajectory id.
    """
    if not trajectories:
        raise DataError("empty batch: no trajectories")
    kept: list[Trajectory] = []
    source: list[int] = []
    for k, tr in enumerate(trajectories):
        n = len(tr.token_ids)
        if len(tr.loss_mask) != n or len(tr.behaviour_logprobs) != n:
            raise DataError(
                f"trajectory {tr.id}: {n} token ids, {len(tr.loss_mask)} loss-mask entries and "
                f"{len(tr.behaviour_logprobs)} behaviour log-probabilities"
            )
        if not any(tr.loss_mask):
            continue
        if tr.loss_mask[0]:
            raise DataError(f"trajectory {tr.id}: its first token is a policy token and has no context")
        for j, (m, lp) in enumerate(zip(tr.loss_mask, tr.behaviour_logprobs, strict=True)):
            if m and (not math.isfinite(lp) or lp > 1e-6):
                raise DataError(f"trajectory {tr.id}: invalid behaviour log-probability {lp!r} at token {j}")
        kept.append(tr)
        source.append(k)
    if not kept:
        raise DataError(f"empty batch: none of the {len(trajectories)} trajectories has a policy token")

    b = len(kept)
    seq = max(len(tr.token_ids) for tr in kept)
    input_ids = torch.full((b, seq), pad_token_id, dtype=torch.long)
    attention = torch.zeros((b, seq), dtype=torch.long)
    loss_mask = torch.zeros((b, seq), dtype=torch.bool)
    blp = torch.zeros((b, seq), dtype=torch.float32)
    for i, tr in enumerate(kept):
        n = len(tr.token_ids)
        input_ids[i, :n] = torch.tensor(tr.token_ids, dtype=torch.long)
        attention[i, :n] = 1
        loss_mask[i, :n] = torch.tensor(tr.loss_mask, dtype=torch.bool)
        blp[i, :n] = torch.tensor(tr.behaviour_logprobs, dtype=torch.float32)
    lengths = loss_mask.sum(dim=1)
    return PolicyBatch(
        input_ids=input_ids,
        attention_mask=attention,
        labels=input_ids[:, 1:].clone(),
        loss_mask=loss_mask[:, 1:].clone(),
        behaviour_logprobs=blp[:, 1:].clone(),
        rewards=torch.tensor([float(tr.reward) for tr in kept], dtype=torch.float32),
        lengths=lengths,
        advantages=torch.zeros(b, dtype=torch.float32),
        gate_d=torch.zeros(b, dtype=torch.float32),
        gate_mask=loss_mask[:, 1:].clone(),
        failed=torch.zeros(b, dtype=torch.bool),
        ids=tuple(tr.id for tr in kept),
        global_batch_size=b,
        global_tokens=int(lengths.sum()),
        excluded_rows=len(trajectories) - b,
        source_index=tuple(source),
    )


def split_micro_batches(batch: PolicyBatch, micro_batch_size: int) -> list[PolicyBatch]:
    """Consecutive micro-batches of at most ``micro_batch_size`` rows (rows are never split).

    Every micro-batch keeps ``global_batch_size``, ``global_tokens`` and each row's ``lengths``, so
    the objectives' partial losses add up to the full-batch loss.

    Raises:
        DataError: ``micro_batch_size < 1``.
    """
    return [batch.select(rows) for rows in micro_batch_rows(batch, micro_batch_size)]


def micro_batch_rows(
    batch: PolicyBatch, max_rows: int, max_tokens: int | None = None, prefix: int = 0
) -> list[list[int]]:
    """Row indices of each micro-batch: at most ``max_rows`` rows and, given, ``max_tokens`` padded tokens.

    Without ``max_tokens``: consecutive runs of ``max_rows`` rows (as :func:`split_micro_batches`).
    With it: rows sorted by length (shortest first, ties in row order) and packed greedily, a
    micro-batch growing while its padded pass, ``rows * (longest row - prefix)`` tokens, stays within
    ``max_tokens``; so no row is padded beyond the longest row of its own micro-batch, and the pass's
    size does not grow with B. A row longer than the budget by itself runs alone in its own micro-batch.

    Args:
        batch: The batch (its ``attention_mask`` gives each row's length in tokens).
        max_rows: Most rows per micro-batch (>= 1).
        max_tokens: Most padded tokens per micro-batch pass (>= 1), or None for rows only.
        prefix: Leading tokens served from a shared KV cache (:mod:`agentenv.trainer.learners.shared_prefix`),
            not run by the micro-batches and so not counted.

    Returns:
        Lists of row indices into ``batch``, every row exactly once.

    Raises:
        DataError: ``max_rows < 1`` or ``max_tokens < 1``.
    """
    if max_rows < 1:
        raise DataError(f"micro_batch_size must be >= 1, got {max_rows}")
    rows = batch.num_rows
    if max_tokens is None:
        return [list(range(s, min(s + max_rows, rows))) for s in range(0, rows, max_rows)]
    if max_tokens < 1:
        raise DataError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens}")
    lengths = batch.attention_mask.sum(dim=1).tolist()
    groups: list[list[int]] = []
    for i in sorted(range(rows), key=lambda r: (lengths[r], r)):
        own = max(int(lengths[i]) - prefix, 1)
        if groups and len(groups[-1]) < max_rows and (len(groups[-1]) + 1) * own <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def shard_offset(rows: int, rank: int, world_size: int) -> int:
    """The first row of rank ``rank``'s share of ``rows`` rows (see :func:`shard`)."""
    per, extra = divmod(rows, world_size)
    return rank * per + min(rank, extra)


def shard(batch: PolicyBatch, rank: int, world_size: int) -> PolicyBatch | None:
    """Rank ``rank``'s contiguous share of the rows for data parallelism (None when it gets none).

    Shares differ by at most one row; B and N stay global.

    Raises:
        DataError: ``rank`` outside ``[0, world_size)``.
    """
    if not 0 <= rank < world_size:
        raise DataError(f"rank {rank} outside [0, {world_size})")
    per, extra = divmod(batch.num_rows, world_size)
    start = shard_offset(batch.num_rows, rank, world_size)
    stop = start + per + (1 if rank < extra else 0)
    return batch.select(slice(start, stop)) if stop > start else None
