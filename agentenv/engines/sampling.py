"""Temperature and top-p processing, sampling, and the behaviour log-probabilities that go with them.

The behaviour log-probability of a sampled token is its log-probability under the *processed*
distribution actually sampled from: logits divided by the temperature, the nucleus (top-p) kept and
renormalised, all in float32. This is what vLLM reports with ``logprobs_mode="processed_logprobs"``
and the top-p rule below is vLLM's (sort ascending, drop tokens whose cumulative mass from the
smallest up is ``<= 1 - top_p``, always keep the most likely), so both engines store the same numbers.
Temperature 0 means greedy decoding; its processed distribution is a point mass, so the reported
log-probability is 0.0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from agentenv.engines.base import SamplingParams
from agentenv.errors import ConfigError


def validate_params(params: SamplingParams) -> None:
    """Check a request's sampling settings.

    Raises:
        ConfigError: ``max_new_tokens < 0``, ``temperature < 0`` or not finite, ``top_p`` outside (0, 1],
            or a negative stop token id.
    """
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    if params.max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if not (params.temperature >= 0.0 and params.temperature < float("inf")):
        raise ConfigError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not (0.0 < params.top_p <= 1.0):
        raise ConfigError(f"top_p must be in (0, 1], got {params.top_p}")
    if any(t < 0 for t in params.stop_token_ids):
        raise ConfigError(f"stop_token_ids must be non-negative, got {params.stop_token_ids}")


def processed_logprobs(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of the distribution that is sampled from.

    Args:
        logits: ``(B, V)`` raw next-token logits (any float dtype; computed in float32).
        temperature: ``(B,)`` per-row temperature; rows with 0 are greedy (their row is returned as
            plain ``log_softmax`` of the logits, use :func:`sample` to pick the argmax).
        top_p: ``(B,)`` per-row nucleus mass in (0, 1].

    Returns:
        ``(B, V)`` float32 log-probabilities (nats), ``-inf`` outside the nucleus. B: rows, V: vocabulary.
    """
    x = logits.float()
    temp = temperature.to(x.device, torch.float32)
    x = x / torch.where(temp > 0, temp, torch.ones_like(temp)).unsqueeze(-1)
    p = top_p.to(x.device, torch.float32)
    if bool((p < 1.0).any()):
        sorted_logits, order = x.sort(dim=-1, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cum <= (1.0 - p).unsqueeze(-1)
        drop[:, -1] = False  # always keep the most likely token
        x = x.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return x.log_softmax(dim=-1)


def sample(
    logprobs: torch.Tensor,
    greedy: Sequence[bool],
    generators: Sequence[torch.Generator | None],
) -> tuple[list[int], list[float]]:
    """Draw one token per row from processed log-probabilities.

    Each row draws with its own generator (so a seeded request gets the same tokens whatever else is in
    the batch); a greedy row takes the argmax and reports log-probability 0.0. Sampling stays on the
    logits' device; only the ``B`` chosen ids and log-probabilities are copied to the host.

    Args:
        logprobs: ``(B, V)`` output of :func:`processed_logprobs`.
        greedy: ``B`` flags, True for temperature-0 rows.
        generators: ``B`` generators on ``logprobs.device`` (None: the global RNG).

    Returns:
        ``(token_ids, logprobs)``: ``B`` sampled ids and their behaviour log-probabilities (nats).
    """
    device = logprobs.device
    greedy_mask = torch.tensor(list(greedy), device=device)
    if all(greedy):
        ids = logprobs.argmax(dim=-1)
        return ids.tolist(), [0.0] * len(greedy)
    # Inverse-CDF draw: one uniform per row from the row's own generator (torch.multinomial costs
    # tens of ms per row on a large vocabulary on CPUs). ``right=True`` never lands on a zero-mass token.
    cdf = logprobs.exp().cumsum(dim=-1)
    u = torch.cat([torch.rand(1, generator=gen, device=device) for gen in generators])
    ids = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    ids = ids.clamp_(max=logprobs.shape[1] - 1)
    if any(greedy):
        ids = torch.where(greedy_mask, logprobs.argmax(dim=-1), ids)
    chosen = logprobs.gather(1, ids.unsqueeze(1)).squeeze(1)
    chosen = torch.where(greedy_mask, torch.zeros_like(chosen), chosen)
    return ids.tolist(), chosen.tolist()
