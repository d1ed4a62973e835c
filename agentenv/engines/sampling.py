"""Temperature, top-k and top-p processing, sampling, and the behaviour log-probabilities that go with them.

The behaviour log-probability of a sampled token is its log-probability under the *processed*
distribution actually sampled from: logits divided by the temperature, then the top-k and the nucleus
(top-p) kept and renormalised, all in float32. This is what vLLM reports with
``logprobs_mode="processed_logprobs"`` and the truncation rule below is vLLM's
(:func:`truncation_mask`: top-k keeps every token whose logit is at least the k-th largest; top-p then
sorts the top-k distribution ascending, drops tokens whose cumulative mass from the smallest up is
``<= 1 - top_p`` and always keeps the most likely), so both engines store the same numbers.
Temperature 0 means greedy decoding; its processed distribution is a point mass, so the reported
log-probability is 0.0.

The learner scores the current policy under the same processing (:class:`SamplingTransform` and
:func:`label_logprobs`), so that its log pi and the stored log mu describe the same distribution: the
trust gate and the importance ratio compare like with like. Both sides use :func:`truncation_mask`,
the one implementation of the top-k/top-p rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agentenv.engines.base import MAX_TOP_LOGPROBS, SamplingParams
from agentenv.errors import ConfigError

__all__ = [
    "SamplingTransform",
    "check_top_k",
    "label_logprobs",
    "processed_logprobs",
    "sample",
    "top_alternatives",
    "truncation_mask",
    "validate_params",
]

# Rows x vocabulary elements per chunk of the no-gradient top-k/top-p sort in label_logprobs: the sort
# holds a float32 copy and an int64 permutation (12 bytes an element), so about 200 MB per chunk.
_SORT_CHUNK_ELEMENTS = 1 << 24


def check_top_k(top_k: object, where: str = "top_k") -> None:
    """Refuse a bad top-k setting (None or 0: off; k >= 1: keep the k most likely tokens).

    Raises:
        ConfigError: ``top_k`` is negative or not an integer (a bool is not an integer here).
    """
    if top_k is None:
        return
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ConfigError(f"{where} must be an integer (0 or None: off), got {top_k!r}")
    if top_k < 0:
        raise ConfigError(f"{where} must be >= 1 to keep the k most likely tokens, or 0/None for off; got {top_k}")


def validate_params(params: SamplingParams) -> None:
    """Check a request's sampling settings.

    Raises:
        ConfigError: ``max_new_tokens < 0``, ``temperature < 0`` or not finite, ``top_p`` outside (0, 1],
            ``top_k`` negative or not an integer, a negative stop token id, or ``top_logprobs`` not an
            integer in [0, :data:`~agentenv.engines.base.MAX_TOP_LOGPROBS`].
    """
    if not isinstance(params, SamplingParams):
        raise ConfigError(f"params must be a SamplingParams, got {type(params).__name__}")
    if params.max_new_tokens < 0:
        raise ConfigError(f"max_new_tokens must be >= 0, got {params.max_new_tokens}")
    if not (params.temperature >= 0.0 and params.temperature < float("inf")):
        raise ConfigError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not (0.0 < params.top_p <= 1.0):
        raise ConfigError(f"top_p must be in (0, 1], got {params.top_p}")
    check_top_k(params.top_k)
    if any(t < 0 for t in params.stop_token_ids):
        raise ConfigError(f"stop_token_ids must be non-negative, got {params.stop_token_ids}")
    top = params.top_logprobs
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP_LOGPROBS:
        raise ConfigError(f"top_logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {top!r}")


def truncation_mask(scaled_logits: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Which tokens the top-k/top-p rule drops (the one implementation of the rule, vLLM's).

    Top-k first: a token is kept iff its logit is ``>=`` the k-th largest logit of its row (ties at the
    threshold are kept). Then top-p on the top-k distribution: sorted ascending, a token is dropped iff
    the cumulative probability from the smallest up to and including it is ``<= 1 - top_p``; the most
    likely token is always kept. No gradient flows through the choice.

    Args:
        scaled_logits: ``(N, V)`` float32 temperature-scaled logits. N: rows, V: vocabulary.
        top_p: ``(N,)`` nucleus mass per row in (0, 1] (1: no nucleus truncation).
        top_k: ``(N,)`` integer k per row; ``<= 0`` or ``>= V`` means no top-k truncation.

    Returns:
        ``(N, V)`` bool, True where the token is dropped.
    """
    x = scaled_logits.detach()
    n, v = x.shape
    p = top_p.to(x.device, torch.float32).reshape(n)
    k = top_k.to(x.device, torch.int64).reshape(n)
    k = torch.where((k <= 0) | (k > v), torch.full_like(k, v), k)
    use_k, use_p = bool((k < v).any()), bool((p < 1.0).any())
    if not (use_k or use_p):
        return torch.zeros(n, v, dtype=torch.bool, device=x.device)
    sorted_x, order = x.sort(dim=-1, descending=False)
    drop = torch.zeros(n, v, dtype=torch.bool, device=x.device)
    if use_k:
        threshold = sorted_x.gather(1, (v - k).unsqueeze(1))
        drop = sorted_x < threshold
        sorted_x = sorted_x.masked_fill(drop, float("-inf"))
    if use_p:
        cum = sorted_x.softmax(dim=-1).cumsum(dim=-1)
        drop_p = cum <= (1.0 - p).unsqueeze(-1)
        drop_p[:, -1] = False  # always keep the most likely token
        drop = drop | drop_p
    return torch.empty_like(drop).scatter_(-1, order, drop)


def processed_logprobs(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities of the distribution that is sampled from.

    Args:
        logits: ``(B, V)`` raw next-token logits (any float dtype; computed in float32).
        temperature: ``(B,)`` per-row temperature; rows with 0 are greedy (their row is returned as
            plain ``log_softmax`` of the truncated logits, use :func:`sample` to pick the argmax).
        top_p: ``(B,)`` per-row nucleus mass in (0, 1].
        top_k: ``(B,)`` per-row integer k (0: off); None: off for every row.

    Returns:
        ``(B, V)`` float32 log-probabilities (nats), ``-inf`` outside the kept set. B: rows, V: vocabulary.
    """
    x = logits.float()
    temp = temperature.to(x.device, torch.float32)
    x = x / torch.where(temp > 0, temp, torch.ones_like(temp)).unsqueeze(-1)
    if top_k is None:
        top_k = torch.zeros(x.shape[0], dtype=torch.int64)
    drop = truncation_mask(x, top_p, top_k)
    if bool(drop.any()):
        x = x.masked_fill(drop, float("-inf"))
    return x.log_softmax(dim=-1)


@dataclass(frozen=True)
class SamplingTransform:
    """The behaviour processing of logits, as the learner must reproduce it.

    The engines sample from ``softmax(logits / temperature)`` restricted to the top-k and then the
    nucleus of mass ``top_p`` (:func:`truncation_mask`) and renormalised; the stored behaviour
    log-probabilities are those of that distribution. The learner scores log pi with the same
    transform (:func:`label_logprobs`). The default is the identity: temperature 1, no truncation.

    Attributes:
        temperature: Softmax temperature, finite and > 0 (greedy decoding has no distribution to score).
        top_p: Nucleus mass in (0, 1]; 1 is off.
        top_k: Keep the k most likely tokens (k >= 1); None or 0 is off; negative is an error.

    Raises:
        ConfigError: temperature not a finite number > 0, top_p outside (0, 1], top_k negative or not an
            integer.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, (int, float)) and 0.0 < self.temperature < math.inf):
            raise ConfigError(
                f"sampling temperature must be a finite number > 0 to score a sampled distribution, "
                f"got {self.temperature!r}"
            )
        if not (isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0):
            raise ConfigError(f"sampling top_p must be in (0, 1], got {self.top_p!r}")
        check_top_k(self.top_k, "sampling top_k")

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p removes any token (a kept set has to be chosen)."""
        return self.top_p < 1.0 or bool(self.top_k)

    @property
    def is_identity(self) -> bool:
        """Temperature 1 without truncation: plain ``log_softmax`` of the logits."""
        return self.temperature == 1.0 and not self.truncates


def label_logprobs(
    logits: torch.Tensor,
    labels: torch.Tensor,
    transform: SamplingTransform | None = None,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Processed log-probabilities of the labels, differentiable, and optionally the entropy.

    Computes ``log pi(label)`` under ``transform``: logits scaled by ``1 / temperature``, the kept set of
    :func:`truncation_mask` (top-k, then top-p), renormalised over the kept set. The kept set is chosen
    without gradient; the gradient flows through the temperature scaling and the renormalisation. The
    label is always counted in the kept set: at lag 0 it lies there anyway (it was sampled from it), and
    for a label a later policy would have truncated away this keeps log pi finite (very negative) so
    the gate rejects the row instead of the objective seeing ``-inf``. The sort over the vocabulary
    runs only on the given positions, ``_SORT_CHUNK_ELEMENTS`` elements at a time.

    The identity transform (the default) computes exactly the plain ``cross_entropy`` of the logits.

    Args:
        logits: ``(b, k, V)`` raw logits (any float dtype; computed in float32). b: rows, k: kept label
            positions, V: vocabulary.
        labels: ``(b, k)`` int64 token ids in ``[0, V)``.
        transform: The behaviour processing; None is the identity.
        with_entropy: Also return the entropy of the processed distribution (nats), without gradient.

    Returns:
        ``(logprobs (b, k) float32 nats, entropy (b, k) float32 nats or None)``.
    """
    transform = transform if transform is not None else SamplingTransform()
    b, k, v = logits.shape
    x = logits.float()
    if transform.temperature != 1.0:
        x = x / transform.temperature
    flat_labels = labels.reshape(b * k)
    if not transform.truncates:
        lp = -F.cross_entropy(x.reshape(b * k, v), flat_labels, reduction="none").view(b, k)
        ent = None
        if with_entropy:
            with torch.no_grad():
                logp = torch.log_softmax(x.detach(), dim=-1)
                ent = -(logp.exp() * logp).sum(-1)
        return lp, ent
    flat = x.reshape(b * k, v)
    with torch.no_grad():
        drop = torch.empty(b * k, v, dtype=torch.bool, device=x.device)
        step = max(1, _SORT_CHUNK_ELEMENTS // max(v, 1))
        for start in range(0, b * k, step):
            rows = flat[start : start + step]
            n = rows.shape[0]
            drop[start : start + n] = truncation_mask(
                rows,
                torch.full((n,), transform.top_p, dtype=torch.float32),
                torch.full((n,), transform.top_k or 0, dtype=torch.int64),
            )
        drop.scatter_(1, flat_labels.unsqueeze(1), False)  # the label is always in the kept set
    logp = flat.masked_fill(drop, float("-inf")).log_softmax(dim=-1)
    lp = logp.gather(1, flat_labels.unsqueeze(1)).view(b, k)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = torch.special.entr(logp.detach().exp()).sum(-1).view(b, k)
    return lp, ent


def top_alternatives(
    logprobs: torch.Tensor, ks: Sequence[int], chosen: Sequence[int], greedy: Sequence[bool]
) -> list[tuple[tuple[int, float], ...] | None]:
    """The most likely tokens of each row's processed distribution (``GenerationOutput.top_logprobs``).

    Args:
        logprobs: ``(B, V)`` output of :func:`processed_logprobs` (nats, ``-inf`` where cut).
        ks: ``B`` alternatives wanted per row (0: none, that row's entry is None).
        chosen: ``B`` sampled ids (what a greedy row reports).
        greedy: ``B`` flags, True for temperature-0 rows: their only alternative is the chosen id at
            0.0, as :func:`sample` reports it.

    Returns:
        Per row, None or up to ``k`` ``(id, log-probability)`` pairs, most likely first; tokens at
        ``-inf`` (cut by top-k or top-p) are left out.
    """
    k_max = max(ks, default=0)
    out: list[tuple[tuple[int, float], ...] | None] = [None] * len(ks)
    if k_max <= 0:
        return out
    values, ids = logprobs.topk(min(k_max, logprobs.shape[-1]), dim=-1)
    values, ids = values.tolist(), ids.tolist()
    for b, k in enumerate(ks):
        if k <= 0:
            continue
        if greedy[b]:
            out[b] = ((int(chosen[b]), 0.0),)
        else:
            out[b] = tuple((i, v) for i, v in zip(ids[b][:k], values[b][:k], strict=True) if v != float("-inf"))
    return out


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
