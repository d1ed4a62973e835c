"""FlashREINFORCE's trust gate: the Bernoulli-KL statistic ``D_i`` and the rows or tokens it admits.

docs/algorithms.md, "FlashREINFORCE": with ``p = mu(a_t)`` (behaviour) and ``q = pi_theta(a_t)``
(current), ``d_t = p log(p/q) + (1-p) log((1-p)/(1-q))`` and ``D_i = max(0, mean_t d_t)``; the
sequence gate admits row ``i`` when ``D_i <= delta``. Tensor legend as in :mod:`agentenv.trainer.objectives`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.work_dtype import work_dtype

__all__ = ["GATES", "PROB_EPS", "GateDecision", "bernoulli_kl_gate", "check_delta", "check_gate", "trust_gate"]

#: Probability clamp used by the gate only (docs/algorithms.md, "FlashREINFORCE"): p, q in [PROB_EPS, 1 - PROB_EPS].
PROB_EPS = 1e-6
#: FlashREINFORCE gate choices (:func:`trust_gate`): the paper's sequence gate, a token-local mask, none.
GATES = ("sequence", "token", "none")


def check_delta(delta: float) -> None:
    """Raise :class:`ConfigError` unless ``delta`` is a finite number >= 0 (nats)."""
    if not (isinstance(delta, (int, float)) and math.isfinite(delta) and delta >= 0):
        raise ConfigError(f"gate delta must be a finite number >= 0, got {delta!r}")


def check_gate(gate: str, field: str = "gate") -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``gate`` is one of :data:`GATES`."""
    if gate not in GATES:
        raise ConfigError(f"{field} must be 'sequence', 'token' or 'none', got {gate!r}")


def bernoulli_kl_gate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashREINFORCE's sequence-level trust gate on a Bernoulli-KL proxy (docs/algorithms.md, "FlashREINFORCE").

    With ``p = mu(a_t)`` (behaviour) and ``q = pi_theta(a_t)`` (current), both clamped to
    ``[1e-6, 1 - 1e-6]`` here only, ``d_t = p log(p/q) + (1-p) log((1-p)/(1-q))``,
    ``D_i = max(0, mean_t d_t)`` over row ``i``'s policy tokens, and ``m_i = 1[D_i <= delta]``.

    Args:
        logprobs: ``(b, t)`` current log-probabilities log q (no gradient is taken through the gate).
        behaviour_logprobs: ``(b, t)`` behaviour log-probabilities log p.
        mask: ``(b, t)`` bool, True at policy tokens; every row needs at least one.
        delta: Threshold (nats), >= 0.

    Returns:
        ``(D, admitted)``: ``(b,)`` float and ``(b,)`` bool.

    Raises:
        ConfigError: negative delta. DataError: an empty row.
    """
    check_delta(delta)
    _, d_row = _row_kl(logprobs, behaviour_logprobs, mask)
    return d_row, d_row <= delta


@dataclass(frozen=True)
class GateDecision:
    """What :func:`trust_gate` decided (``b`` rows, ``t`` positions).

    Attributes:
        d: ``(b,)`` float, ``D_i = max(0, mean_t d_t)`` over row i's policy tokens (nats), whatever the gate.
        rows: ``(b,)`` bool, rows that keep any gradient (the sequence gate's ``m_i``; under the token
            gate, rows with at least one admitted token; all True without a gate).
        tokens: ``(b, t)`` bool, policy tokens that keep their gradient (``m_it``); False off the mask.
    """

    d: torch.Tensor
    rows: torch.Tensor
    tokens: torch.Tensor


def trust_gate(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
    gate: str = "sequence",
) -> GateDecision:
    """The trust gate ``m_it`` of the FlashREINFORCE loss, sequence-level (the method), token-local or none.

    With the per-token Bernoulli-KL term ``d_it = p log(p/q) + (1-p) log((1-p)/(1-q))`` of
    :func:`bernoulli_kl_gate` (``p = mu(a_it)``, ``q = pi_theta(a_it)``, clamped to
    ``[1e-6, 1 - 1e-6]``) and ``D_i = max(0, (1/T_i) sum_t d_it)``:

    * ``"sequence"``: ``m_it = m_i = 1[D_i <= delta]`` (the whole row, FlashREINFORCE's gate);
    * ``"token"``: ``m_it = 1[d_it <= delta]``, each token on its own (a token-local mask, the
      ablation of the sequence gate); the loss keeps the row's denominator ``T_i``, so
      ``L = -(1/B) sum_i (A_i / T_i) sum_t m_it rho_it log pi_theta(a_it)``;
    * ``"none"``: ``m_it = 1`` (every row and token admitted).

    ``D_i`` is computed in every mode (the ``mean_d`` figure measures the train-inference mismatch
    with or without a gate).

    Args:
        logprobs: ``(b, t)`` current log q (detached here).
        behaviour_logprobs: ``(b, t)`` stored log p.
        mask: ``(b, t)`` bool policy-token mask; every row needs at least one.
        delta: Threshold (nats), >= 0 (unused by ``"none"`` but still checked).
        gate: One of :data:`GATES`.

    Returns:
        :class:`GateDecision`.

    Raises:
        ConfigError: negative delta or an unknown gate. DataError: an empty row.
    """
    check_gate(gate)
    mask = mask.bool()
    if gate == "sequence":
        d_row, rows = bernoulli_kl_gate(logprobs, behaviour_logprobs, mask, delta)
        return GateDecision(d_row, rows, mask & rows.unsqueeze(1))
    check_delta(delta)
    d, d_row = _row_kl(logprobs, behaviour_logprobs, mask)
    if gate == "none":
        return GateDecision(d_row, torch.ones_like(d_row, dtype=torch.bool), mask)
    tokens = mask & (d <= delta)
    return GateDecision(d_row, tokens.any(dim=1), tokens)


def _row_kl(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d, D)``: ``(b, t)`` the terms d_t of :func:`_token_kl` and ``(b,)`` ``D_i = max(0, (1/T_i) sum_t d_t)``."""
    d, counts, dtype = _token_kl(logprobs, behaviour_logprobs, mask)
    return d, (d.sum(dim=1) / counts.to(dtype)).clamp_min(0.0)


def _token_kl(
    logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.dtype]:
    """``(d, counts, dtype)``: ``(b, t)`` Bernoulli-KL terms d_t (0 off the mask), ``(b,)`` T_i, the working dtype.

    Raises:
        DataError: an empty row.
    """
    mask = mask.bool()
    counts = mask.sum(dim=1)
    if (counts == 0).any():
        raise DataError(f"rows {torch.nonzero(counts == 0).flatten().tolist()} have no policy token")
    dtype = work_dtype(logprobs)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lq = torch.where(mask, logprobs.detach().to(dtype), zero)
    lp = torch.where(mask, behaviour_logprobs.detach().to(dtype), zero)
    p = lp.exp().clamp(PROB_EPS, 1.0 - PROB_EPS)
    q = lq.exp().clamp(PROB_EPS, 1.0 - PROB_EPS)
    d = p * (p.log() - q.log()) + (1.0 - p) * (torch.log1p(-p) - torch.log1p(-q))
    return torch.where(mask, d, zero), counts, dtype
