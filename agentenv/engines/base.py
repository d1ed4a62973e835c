"""The generation-engine contract shared by the transformers and vLLM engines.

An engine turns a prompt (token ids) into sampled token ids plus the sampler's own behaviour
log-probability of each sampled token, batched across concurrent callers. Weight updates arrive with
a new policy version; in-flight requests are interrupted at the next token boundary, the weights are
swapped, and each request continues from its prefix (partial-rollout continuation). The output
reports which version sampled every token and which version computed the prefix it continued from.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


class ContinuationMode(str, enum.Enum):
    """What happens to an in-flight request's KV cache when new weights arrive.

    KEEP: keep the cache computed by the older weights (``prefix_version < version`` afterwards).
    RECOMPUTE: recompute the prefix under the new weights (``prefix_version == version``).
    """

    KEEP = "keep"
    RECOMPUTE = "recompute"


def derive_seed(*parts: int) -> int:
    """A request seed in ``[0, 2**63)`` derived from integers (e.g. task seed, attempt, turn).

    The same parts give the same seed on every machine and Python (a BLAKE2b digest, not ``hash``),
    and different parts give independent-looking seeds, so each request of a run can sample from its
    own generator: its tokens then depend on its own seed and the weights, not on which other
    requests shared the engine's batch or in what order they arrived.

    Raises:
        TypeError: A part that is not an ``int`` (bools are refused too).
    """
    for p in parts:
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"derive_seed takes ints, got {p!r}")
    digest = hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


MAX_TOP_LOGPROBS = 20
"""Most alternatives per sampled token an engine returns (``SamplingParams.top_logprobs``; the OpenAI API's cap)."""


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings for one request.

    Attributes:
        max_new_tokens: Budget of sampled tokens for this request (tokens).
        temperature: Softmax temperature; the behaviour log-probabilities are those of the processed
            (temperature-scaled, top-k- and top-p-truncated) distribution actually sampled from.
        top_p: Nucleus mass in (0, 1].
        top_k: Keep only the k most likely tokens (vLLM's rule, ties at the k-th logit kept) before
            top-p; None or 0 is off, negative is refused (``ConfigError``) by the engines.
        stop_token_ids: Sampling stops after any of these (the chat template's end of turn); the stop
            token is included in the output.
        seed: Per-request seed; None draws from the engine's generator.
        top_logprobs: Alternatives to return per sampled token (0 to :data:`MAX_TOP_LOGPROBS`): the
            most likely tokens of the same processed distribution (``GenerationOutput.top_logprobs``).
    """

    max_new_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True)
class TokenSpan:
    """A run of output tokens sampled under one version: ``num_tokens`` tokens, ``version``, ``prefix_version``."""

    num_tokens: int
    version: int
    prefix_version: int


@dataclass(frozen=True)
class GenerationOutput:
    """The result of one request.

    Attributes:
        token_ids: ``(n,)`` sampled ids, the stop token included when one was sampled.
        logprobs: ``(n,)`` behaviour log-probability (nats) of each sampled id.
        spans: Version runs covering ``token_ids`` in order (their ``num_tokens`` sum to ``n``).
        finish_reason: ``"stop"`` (a stop token), ``"length"`` (``max_new_tokens`` or context limit).
        truncated_context: True when the request hit the model's context length.
        top_logprobs: ``(n,)`` when ``SamplingParams.top_logprobs`` > 0, else None: for each sampled
            token, up to ``top_logprobs`` ``(token id, log-probability)`` pairs, most likely first, under
            the processed distribution the token was drawn from (the one ``logprobs`` comes from). Tokens
            that distribution cannot draw (cut by top-k or top-p) are left out; a greedy token's only
            alternative is itself at 0.0.
    """

    token_ids: list[int]
    logprobs: list[float]
    spans: list[TokenSpan] = field(default_factory=list)
    finish_reason: str = "stop"
    truncated_context: bool = False
    top_logprobs: list[tuple[tuple[int, float], ...]] | None = None


@runtime_checkable
class GenerationEngine(Protocol):
    """What the rollout loop needs from an engine. Implementations: ``TransformersEngine``, ``VLLMEngine``."""

    @property
    def version(self) -> int:
        """The policy version of the weights now serving requests."""
        ...

    @property
    def max_context_tokens(self) -> int:
        """Longest prompt + output the model accepts (tokens)."""
        ...

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """Sample a continuation of ``prompt_ids``.

        Raises:
            agentenv.errors.EngineError: The engine died or the request cannot be served.
        """
        ...

    async def update_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """Swap in new weights (a state dict or a safetensors file) as policy ``version``.

        In-flight requests are interrupted at the next token boundary and continue from their prefix
        according to the engine's :class:`ContinuationMode`.

        Raises:
            agentenv.errors.WeightUpdateError: The weights could not be loaded; the engine keeps the
                previous version and keeps serving.
        """
        ...

    async def close(self) -> None:
        """Stop the engine and free its memory. Safe to call twice."""
        ...
