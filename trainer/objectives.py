"""Policy-gradient objectives: FlashREINFORCE (the method) and GRPO (the comparison baseline).

This is the ONE implementation of both losses; the single-process learner (``trainer/learners/single.py``)
and the OpenRLHF/DeepSpeed backend (``trainer/learners/openrlhf.py``) both call it. The advantages
they take come from :mod:`agentenv.trainer.advantages`, FlashREINFORCE's gate from
:mod:`agentenv.trainer.trust_gate`.

Tensor legend (every function below uses it):

* ``b``: rows in this call (a micro-batch or a rank's shard; ``b <= B``).
* ``B``: rows in the whole fresh batch (the *global* batch size, passed in explicitly).
* ``t``: padded token positions per row (label positions, i.e. position ``j`` holds the
  log-probability of token ``j`` given tokens ``< j``; how the positions are aligned is the
  caller's business as long as all per-token inputs share it).
* ``T_i``: row ``i``'s number of policy tokens in the whole trajectory (``lengths[i]``).

Per-token inputs are ``(b, t)``; padding and environment tokens have ``mask == False`` and may hold
any value, NaN and inf included: they are removed with :func:`torch.where` before any arithmetic,
so they never reach the loss or its gradient. All maths runs in float32 at least (bf16/fp16
inputs are promoted before the gate; float64 inputs stay float64).

Denominators are global: the loss of a micro-batch is the exact partial sum of the full-batch
loss, so summing the losses (or gradients) of any split of a batch into micro-batches, or across
data-parallel ranks (all-reduce SUM), gives the full-batch loss (gradient). A row must not be split
across calls (its gate statistic ``D_i`` is a mean over all its tokens).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.trust_gate import check_delta, check_gate, trust_gate
from agentenv.trainer.work_dtype import as_work_float, work_dtype

__all__ = [
    "ObjectiveOutput",
    "ObjectiveStats",
    "check_is_truncation",
    "check_loss_constant",
    "entropy_filter_mask",
    "flash_reinforce_loss",
    "grpo_loss",
]

#: Log-ratio clamp for rho = exp(clamp(log q - log p, -RHO_LOG_CLAMP, RHO_LOG_CLAMP)).
RHO_LOG_CLAMP = 30.0
#: Largest log-probability accepted as "not positive" (float rounding of log_softmax), in nats.
LOGPROB_TOL = 1e-4


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------
def _check_fraction(q: float) -> None:
    if not (isinstance(q, (int, float)) and 0.0 <= q <= 1.0):
        raise ConfigError(f"entropy keep fraction must lie in [0, 1], got {q!r}")


def check_is_truncation(c: float | None, field: str = "is_truncation") -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``c`` is None or a number > 0 (inf allowed)."""
    if c is not None and not (isinstance(c, (int, float)) and not isinstance(c, bool) and c > 0):
        raise ConfigError(f"{field} (the importance ratio's cap C) must be a number > 0 or null (off), got {c!r}")


def check_loss_constant(c: float | None, field: str = "loss_constant") -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``c`` is None or a finite number > 0 (tokens)."""
    if c is not None and not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)
                              and c > 0):
        raise ConfigError(f"{field} (the constant normaliser, in policy tokens) must be a finite number > 0 "
                          f"or null, got {c!r}")


# ---------------------------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ObjectiveStats:
    """Summable statistics of one objective call; add the stats of micro-batches/ranks with ``+``.

    Attributes:
        rows: Rows seen (b).
        admitted: Rows admitted by the gate (FlashREINFORCE; under the token gate, rows with at
            least one admitted token) or all rows (GRPO).
        admitted_tokens: Policy tokens the gate admits (sequence gate: the tokens of admitted rows;
            token gate: tokens with ``d_t <= delta``; no gate and GRPO: all), before the entropy filter.
        excluded_rows: Rows dropped before the objective because they had no policy token (filled
            in by the batching layer; the objective itself rejects empty rows).
        tokens: Policy tokens seen (sum of T_i over the rows here).
        kept_tokens: Policy tokens that carry gradient (after gate and entropy filter).
        d_sum: Sum over rows of the gate statistic D_i (nats).
        rho_sum: Sum over policy tokens of rho = pi_theta / mu (before any truncation).
        adv_sum / adv_sq_sum: Sum and sum of squares of the rows' advantages.
        loss_sum: This call's loss value (a partial sum of the full-batch loss).
        surrogate_sum: Partial sum of the importance-weighted surrogate
            ``L_surr = -(1/B) sum_i m_i (A_i/T_i) sum_t rho_it`` (FlashREINFORCE, with the loss's
            normaliser and truncated ratio; 0 for GRPO).
        clipped_tokens: Tokens whose PPO ratio was clipped (GRPO; 0 for FlashREINFORCE).
        behaviour_nll_sum: Sum over policy tokens of ``-log mu(a_t)``; divided by tokens it is a
            sample estimate of the behaviour policy's entropy (nats/token).
        entropy_sum: Sum over the policy tokens of scored rows of the exact entropy (nats) of the
            current policy pi_theta at the token's position, under the sampling transform (filled in
            by the learner's micro-step; 0 where no forward pass ran).
        entropy_tokens: Policy tokens counted in ``entropy_sum``.
    """

    rows: int = 0
    admitted: int = 0
    admitted_tokens: int = 0
    excluded_rows: int = 0
    tokens: int = 0
    kept_tokens: int = 0
    d_sum: float = 0.0
    rho_sum: float = 0.0
    adv_sum: float = 0.0
    adv_sq_sum: float = 0.0
    loss_sum: float = 0.0
    surrogate_sum: float = 0.0
    clipped_tokens: int = 0
    behaviour_nll_sum: float = 0.0
    entropy_sum: float = 0.0
    entropy_tokens: int = 0

    def __add__(self, other: ObjectiveStats) -> ObjectiveStats:
        merged = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        return ObjectiveStats(**merged)

    @property
    def admitted_fraction(self) -> float:
        """Share of rows admitted by the gate (nan when no rows)."""
        return self.admitted / self.rows if self.rows else math.nan

    @property
    def admitted_token_fraction(self) -> float:
        """Share of policy tokens admitted by the gate (nan when no tokens)."""
        return self.admitted_tokens / self.tokens if self.tokens else math.nan

    @property
    def mean_d(self) -> float:
        """Mean gate statistic D over rows (nats)."""
        return self.d_sum / self.rows if self.rows else math.nan

    @property
    def mean_rho(self) -> float:
        """Mean importance ratio over policy tokens."""
        return self.rho_sum / self.tokens if self.tokens else math.nan

    @property
    def advantage_mean(self) -> float:
        """Mean advantage over rows."""
        return self.adv_sum / self.rows if self.rows else math.nan

    @property
    def advantage_std(self) -> float:
        """Population standard deviation of the advantages over rows."""
        if not self.rows:
            return math.nan
        m = self.adv_sum / self.rows
        return math.sqrt(max(self.adv_sq_sum / self.rows - m * m, 0.0))

    @property
    def policy_entropy(self) -> float:
        """Mean exact entropy of pi_theta over the scored policy tokens (nats/token; nan when none scored)."""
        return self.entropy_sum / self.entropy_tokens if self.entropy_tokens else math.nan

    @property
    def clip_fraction(self) -> float:
        """Share of policy tokens whose PPO ratio was clipped (GRPO)."""
        return self.clipped_tokens / self.tokens if self.tokens else math.nan

    def to_dict(self) -> dict[str, float]:
        """Flat dict of the raw sums and the derived means, for metrics."""
        d: dict[str, float] = {f.name: float(getattr(self, f.name)) for f in fields(self)}
        d.update(
            admitted_fraction=self.admitted_fraction,
            admitted_token_fraction=self.admitted_token_fraction,
            mean_d=self.mean_d,
            mean_rho=self.mean_rho,
            advantage_mean=self.advantage_mean,
            advantage_std=self.advantage_std,
            clip_fraction=self.clip_fraction,
            policy_entropy=self.policy_entropy,
        )
        return d


@dataclass(frozen=True)
class ObjectiveOutput:
    """What an objective returns.

    Attributes:
        loss: Scalar tensor to call ``backward()`` on (this call's partial sum of the batch loss).
        stats: :class:`ObjectiveStats` for this call.
        admitted: ``(b,)`` bool, the gate decision per row (all True for GRPO).
        d: ``(b,)`` float, the gate statistic D_i per row (zeros for GRPO).
    """

    loss: torch.Tensor
    stats: ObjectiveStats
    admitted: torch.Tensor
    d: torch.Tensor


# ---------------------------------------------------------------------------------------------
# Entropy filter
# ---------------------------------------------------------------------------------------------
def entropy_filter_mask(
    entropies: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor, keep_fraction: float
) -> torch.Tensor:
    """Keep the ``ceil(q * T_i)`` highest-entropy policy tokens of the selected rows.

    Ties are broken by position (earlier first). ``ceil`` is taken of ``q * T_i - 1e-9`` so float
    rounding (``0.7 * 10 = 7.000000000000001``) does not keep an extra token.

    Args:
        entropies: ``(b, t)`` per-token entropy of the current policy (nats); masked positions ignored.
        mask: ``(b, t)`` bool policy-token mask.
        rows: ``(b,)`` bool, rows the filter applies to (failed trajectories); others keep all tokens.
        keep_fraction: ``q`` in [0, 1].

    Returns:
        ``(b, t)`` bool mask of the tokens that keep their gradient.

    Raises:
        ConfigError: ``keep_fraction`` outside [0, 1].
    """
    _check_fraction(keep_fraction)
    mask = mask.bool()
    ent = torch.where(mask, entropies.detach().float(), torch.tensor(-math.inf, device=mask.device))
    ent = torch.nan_to_num(ent, nan=-math.inf)  # a NaN entropy at a policy token ranks last
    order = torch.argsort(ent, dim=1, descending=True, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(ent.shape[1], device=ent.device).expand_as(order))
    counts = mask.sum(dim=1).double()
    keep = torch.ceil(counts * keep_fraction - 1e-9).clamp_min(0).long()
    filtered = mask & (ranks < keep.unsqueeze(1))
    return torch.where(rows.bool().unsqueeze(1), filtered, mask)


# ---------------------------------------------------------------------------------------------
# Losses
# ---------------------------------------------------------------------------------------------
def flash_reinforce_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    batch_size: int,
    *,
    delta: float = 1e-3,
    admitted: torch.Tensor | None = None,
    gate_d: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    entropy_keep_fraction: float | None = None,
    failed: torch.Tensor | None = None,
    row_ids: Sequence[str] | None = None,
    total_tokens: int | None = None,
    gate: str = "sequence",
    token_admitted: torch.Tensor | None = None,
    is_truncation: float | None = None,
    loss_constant: float | None = None,
) -> ObjectiveOutput:
    """FlashREINFORCE sample-mean loss with the sequence-level Bernoulli-KL trust gate (docs/algorithms.md).

    ``L = -(1/B) sum_i m_i (A_i / T_i) sum_t rho_it log pi_theta(a_it)``, with ``rho =
    exp(clamp(log q - log p, -30, 30))`` detached (float32 at least) and ``m_i`` the gate decision.
    Its gradient w.r.t. ``log pi_theta(a_it)`` is ``-m_i A_i rho_it / (B T_i)``, that of the
    importance-weighted surrogate ``-(1/B) sum_i m_i (A_i/T_i) sum_t rho_it`` (reported in the stats).
    Rejected rows stay in ``B``. With ``A`` from :func:`agentenv.trainer.advantages.batch_mean_advantages`
    over all B rows, the gradient is exactly zero when all rewards are equal or all rows are rejected.

    Optional negative-token entropy filter: for ``failed`` rows keep only the ``ceil(q T_i)``
    highest-entropy tokens; the denominator stays ``T_i``.

    Optional token-mean aggregation (``total_tokens = N``, the global batch's policy tokens): the
    per-row coefficient ``A_i / (B T_i)`` becomes ``A_i / N`` (DAPO's token-level loss, arXiv
    2503.14476 sec. 3.3), so long trajectories weigh more; the ablation of the sample mean.

    Optional constant normaliser (``loss_constant = K``, policy tokens): every row's token sum is
    divided by the same ``K`` instead of its own ``T_i``, then averaged over B:
    ``L = -(1/B) sum_i m_i (A_i / K) sum_t rho_it log pi_theta(a_it)``, gradient
    ``-m_i A_i rho_it / (B K)`` per token, so a row's total weight grows with ``T_i`` (a long failed
    trajectory is pushed down in proportion to its length, not by the same total as a short one).
    Each row's coefficient depends only on global constants, so any split gives the same gradient.

    Optional truncated importance sampling (``is_truncation = C > 0``): ``rho_it`` is replaced by
    ``min(rho_it, C)`` in the loss (still detached), which bounds every token's weight by ``C``
    times the on-policy one; ``C = inf`` changes nothing. The stats' ``rho_sum`` stays the ratio
    before truncation.

    Gate choice (``gate``, :func:`trust_gate`): ``"sequence"`` is the method above; ``"token"``
    replaces ``m_i`` by the token-local ``m_it = 1[d_it <= delta]`` (denominator still ``T_i``:
    ``L = -(1/B) sum_i (A_i / T_i) sum_t m_it rho_it log pi_theta(a_it)``); ``"none"`` sets every
    ``m_i = 1``. ``D_i`` is reported in every mode.

    Args:
        logprobs: ``(b, t)`` current log pi_theta(a_t) with gradient (any float dtype).
        behaviour_logprobs: ``(b, t)`` stored sampler log mu(a_t).
        mask: ``(b, t)`` bool/int, True at policy tokens. Other positions may hold NaN/inf.
        advantages: ``(b,)`` this call's rows' advantages, computed over the *global* batch.
        lengths: ``(b,)`` int, T_i: each row's policy-token count in the whole trajectory; must equal
            ``mask.sum(1)`` (rows are never split).
        batch_size: B, the global number of rows in the fresh batch (>= b).
        delta: Gate threshold (nats), >= 0.
        admitted: ``(b,)`` bool precomputed gate decision (e.g. from a scoring pass); None computes
            it here from ``logprobs`` (detached).
        gate_d: ``(b,)`` the D_i (nats) behind a precomputed ``admitted``, reported in the stats
            (``d_sum``); ignored when ``admitted`` is None. Without it a precomputed decision reports
            D = 0.
        entropies: ``(b, t)`` per-token policy entropy (nats), needed only by the entropy filter.
        entropy_keep_fraction: ``q`` in [0, 1], or None for no filter.
        failed: ``(b,)`` bool, rows the entropy filter applies to; default ``advantages < 0``.
        row_ids: Optional names of the rows (trajectory ids) used in error messages.
        total_tokens: N for token-mean aggregation (>= this call's policy tokens); None: sample mean.
        gate: ``"sequence"`` (default), ``"token"`` or ``"none"`` (:data:`agentenv.trainer.trust_gate.GATES`).
        token_admitted: ``(b, t)`` bool precomputed token-gate decision ``m_it`` (``gate="token"``
            with a precomputed ``admitted``, which then says which rows have an admitted token);
            required in that case, ignored otherwise.
        is_truncation: C > 0, the cap of the importance ratio in the loss (truncated importance
            sampling), or None (off).
        loss_constant: K > 0 (policy tokens), the constant normaliser replacing each row's ``T_i``,
            or None (sample mean, or token mean with ``total_tokens``).

    Returns:
        :class:`ObjectiveOutput` (loss scalar in the working dtype).

    Raises:
        DataError (a ValueError): an empty row, NaN/inf or a positive value (> 1e-4 nats) in a
            policy position of either log-probability, shape mismatch, ``lengths != mask.sum(1)``,
            ``batch_size < b``, a non-finite advantage, ``total_tokens`` below this call's tokens.
        ConfigError (a ValueError): negative delta, fraction outside [0, 1], filter without entropies,
            an unknown gate, ``gate="token"`` with ``admitted`` but no ``token_admitted``, ``is_truncation``
            not > 0, ``loss_constant`` not > 0, or both ``loss_constant`` and ``total_tokens``.
    """
    check_delta(delta)
    check_gate(gate)
    check_is_truncation(is_truncation)
    check_loss_constant(loss_constant)
    if loss_constant is not None and total_tokens is not None:
        raise ConfigError("give one normaliser: loss_constant (constant) or total_tokens (token mean), not both")
    if entropy_keep_fraction is not None:
        _check_fraction(entropy_keep_fraction)
        if entropies is None:
            raise ConfigError("the entropy filter needs per-token entropies")
    mask, lq, lp, adv, t_i, dtype = _prepare(
        logprobs, behaviour_logprobs, mask, advantages, lengths, batch_size, row_ids
    )
    zero = torch.zeros((), dtype=dtype, device=lq.device)
    gate_tokens = None  # (b, t) the token gate's m_it; None: every policy token of an admitted row
    if admitted is None:  # trust_gate's sequence branch is bernoulli_kl_gate itself
        decision = trust_gate(lq, lp, mask, delta, gate)
        d, admitted = decision.d, decision.rows
        gate_tokens = decision.tokens if gate == "token" else None
    else:
        admitted = admitted.to(device=lq.device, dtype=torch.bool).reshape(-1)
        if admitted.numel() != mask.shape[0]:
            raise DataError(f"admitted has {admitted.numel()} rows, expected {mask.shape[0]}")
        d = torch.zeros(mask.shape[0], dtype=dtype, device=lq.device)
        if gate_d is not None:
            d = gate_d.to(device=lq.device, dtype=dtype).reshape(-1)
            if d.numel() != mask.shape[0]:
                raise DataError(f"gate_d has {d.numel()} rows, expected {mask.shape[0]}")
        if gate == "token":
            if token_admitted is None:
                raise ConfigError("gate='token' with a precomputed admitted needs token_admitted (b, t)")
            if tuple(token_admitted.shape) != tuple(mask.shape):
                raise DataError(f"token_admitted is {tuple(token_admitted.shape)}, expected {tuple(mask.shape)}")
            gate_tokens = mask & token_admitted.to(device=lq.device, dtype=torch.bool) & admitted.unsqueeze(1)

    log_ratio = (lq.detach() - lp).clamp(-RHO_LOG_CLAMP, RHO_LOG_CLAMP)
    rho = torch.where(mask, log_ratio.exp(), zero)
    rho_loss = rho if is_truncation is None else rho.clamp(max=is_truncation)  # min(rho, C)

    token_mask = mask
    if entropy_keep_fraction is not None:
        rows = (adv < 0) if failed is None else failed.to(device=mask.device, dtype=torch.bool).reshape(-1)
        assert entropies is not None
        token_mask = entropy_filter_mask(entropies, mask, rows, entropy_keep_fraction)
    if gate_tokens is not None:  # the token gate: m_it on top of the row coefficient (rows with no m_it = 1 are 0)
        token_mask = token_mask & gate_tokens

    # Per-row coefficient m_i A_i / (B T_i) (token-mean: m_i A_i / N; constant: m_i A_i / (B K)); zero for
    # rejected rows.
    if loss_constant is not None:
        coef = torch.where(admitted, adv / (loss_constant * batch_size), zero)
    elif total_tokens is not None:
        if total_tokens < int(mask.sum()):
            raise DataError(f"total_tokens={total_tokens} is below this call's {int(mask.sum())} policy tokens")
        coef = torch.where(admitted, adv / total_tokens, zero)
    else:
        coef = torch.where(admitted, adv / (t_i * batch_size), zero)
    weights = torch.where(token_mask, rho_loss * coef.unsqueeze(1), zero)
    loss = -(weights * lq).sum()
    surrogate = -(weights.sum())

    stats = ObjectiveStats(
        rows=int(mask.shape[0]),
        admitted=int(admitted.sum()),
        admitted_tokens=int((mask & admitted.unsqueeze(1) if gate_tokens is None else gate_tokens).sum()),
        tokens=int(mask.sum()),
        kept_tokens=int((token_mask & admitted.unsqueeze(1)).sum()),
        d_sum=float(d.sum()),
        rho_sum=float(rho.sum()),
        adv_sum=float(adv.sum()),
        adv_sq_sum=float((adv * adv).sum()),
        loss_sum=float(loss.detach()),
        surrogate_sum=float(surrogate.detach()),
        behaviour_nll_sum=float(-lp.sum()),
    )
    return ObjectiveOutput(loss=loss, stats=stats, admitted=admitted, d=d)


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    total_tokens: int,
    *,
    clip_eps: float = 0.2,
    row_ids: Sequence[str] | None = None,
) -> ObjectiveOutput:
    """GRPO's clipped surrogate with token-mean over the batch (arXiv 2402.03300; clip: 1707.06347 eq. 7).

    ``L = -(1/N) sum_i sum_t min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i)`` with
    ``r = exp(log pi_theta - log mu)`` against the stored behaviour log-probabilities and
    ``N = total_tokens`` the policy-token count of the *global* batch (so micro-batches add up).
    No KL-to-reference term (coefficient 0). Shares validation and masking with
    :func:`flash_reinforce_loss`.

    Args:
        logprobs: ``(b, t)`` current log pi_theta(a_t) with gradient.
        behaviour_logprobs: ``(b, t)`` stored log mu(a_t).
        mask: ``(b, t)`` policy-token mask; other positions may hold NaN/inf.
        advantages: ``(b,)`` from :func:`agentenv.trainer.advantages.group_advantages` over the global batch.
        lengths: ``(b,)`` T_i (must equal ``mask.sum(1)``).
        total_tokens: N, policy tokens in the global batch (>= this call's tokens).
        clip_eps: PPO clip range epsilon (> 0).
        row_ids: Optional trajectory ids for error messages.

    Returns:
        :class:`ObjectiveOutput`; ``admitted`` is all True and ``d`` zeros.

    Raises:
        DataError: as :func:`flash_reinforce_loss`, or ``total_tokens`` below this call's tokens.
        ConfigError: ``clip_eps <= 0``.
    """
    if not clip_eps > 0:
        raise ConfigError(f"clip_eps must be > 0, got {clip_eps}")
    mask, lq, lp, adv, _t_i, dtype = _prepare(
        logprobs, behaviour_logprobs, mask, advantages, lengths, mask.shape[0], row_ids
    )
    n_here = int(mask.sum())
    if total_tokens < n_here:
        raise DataError(f"total_tokens={total_tokens} is below this call's {n_here} policy tokens")
    zero = torch.zeros((), dtype=dtype, device=lq.device)
    log_ratio = torch.where(mask, (lq - lp).clamp(-RHO_LOG_CLAMP, RHO_LOG_CLAMP), zero)
    ratio = log_ratio.exp()
    a = adv.unsqueeze(1)
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a
    per_token = torch.minimum(unclipped, clipped)
    loss = -torch.where(mask, per_token, zero).sum() / total_tokens
    was_clipped = mask & (clipped < unclipped)
    stats = ObjectiveStats(
        rows=int(mask.shape[0]),
        admitted=int(mask.shape[0]),
        admitted_tokens=n_here,
        tokens=n_here,
        kept_tokens=int((mask & ~was_clipped).sum()),
        rho_sum=float(torch.where(mask, ratio.detach(), zero).sum()),
        adv_sum=float(adv.sum()),
        adv_sq_sum=float((adv * adv).sum()),
        loss_sum=float(loss.detach()),
        clipped_tokens=int(was_clipped.sum()),
        behaviour_nll_sum=float(-lp.sum()),
    )
    admitted = torch.ones(mask.shape[0], dtype=torch.bool, device=lq.device)
    return ObjectiveOutput(loss=loss, stats=stats, admitted=admitted, d=torch.zeros_like(adv))


# ---------------------------------------------------------------------------------------------
# Shared input handling
# ---------------------------------------------------------------------------------------------
def _name(i: int, row_ids: Sequence[str] | None) -> str:
    return f"trajectory {row_ids[i]} (row {i})" if row_ids is not None and i < len(row_ids) else f"row {i}"


def _prepare(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    lengths: torch.Tensor,
    batch_size: int,
    row_ids: Sequence[str] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype]:
    """Validate, promote to float32+, and zero the masked positions (with ``torch.where``)."""
    if logprobs.dim() != 2 or logprobs.shape != behaviour_logprobs.shape or logprobs.shape != mask.shape:
        raise DataError(
            f"logprobs {tuple(logprobs.shape)}, behaviour_logprobs {tuple(behaviour_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must all be (b, t)"
        )
    b = logprobs.shape[0]
    if b == 0:
        raise DataError("empty batch: no rows")
    adv = advantages.reshape(-1)
    t_i = lengths.reshape(-1)
    if adv.numel() != b or t_i.numel() != b:
        raise DataError(f"advantages ({adv.numel()}) and lengths ({t_i.numel()}) must have b={b} entries")
    if batch_size < b:
        raise DataError(f"global batch_size={batch_size} is smaller than this call's {b} rows")
    mask = mask.to(device=logprobs.device).bool()
    counts = mask.sum(dim=1)
    empty = torch.nonzero(counts == 0).flatten().tolist()
    if empty:
        raise DataError(f"empty row: {_name(empty[0], row_ids)} has no policy token")
    t_i = t_i.to(device=logprobs.device)
    if not torch.equal(counts, t_i.to(counts.dtype)):
        bad = torch.nonzero(counts != t_i.to(counts.dtype)).flatten().tolist()[0]
        raise DataError(
            f"{_name(bad, row_ids)}: lengths says T_i={int(t_i[bad])} but the mask has {int(counts[bad])} "
            "policy tokens (rows must not be split across calls)"
        )
    dtype = work_dtype(logprobs)
    for name, x in (("current log-probability", logprobs), ("behaviour log-probability", behaviour_logprobs)):
        xd = x.detach()
        bad_nonfinite = mask & ~torch.isfinite(xd)
        if bad_nonfinite.any():
            i, j = torch.nonzero(bad_nonfinite)[0].tolist()
            raise DataError(
                f"{_name(i, row_ids)}: non-finite {name} {float(xd[i, j])} at policy position {j}"
            )
        bad_pos = mask & (xd > LOGPROB_TOL)
        if bad_pos.any():
            i, j = torch.nonzero(bad_pos)[0].tolist()
            raise DataError(f"{_name(i, row_ids)}: positive {name} {float(xd[i, j])} at policy position {j}")
    adv = as_work_float(adv).to(device=logprobs.device, dtype=dtype)
    if not torch.isfinite(adv).all():
        bad_row = int(torch.nonzero(~torch.isfinite(adv))[0])
        raise DataError(f"{_name(bad_row, row_ids)}: non-finite advantage")
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lq = torch.where(mask, logprobs.to(dtype), zero)
    lp = torch.where(mask, behaviour_logprobs.detach().to(device=logprobs.device, dtype=dtype), zero)
    return mask, lq, lp, adv, t_i.to(dtype), dtype
