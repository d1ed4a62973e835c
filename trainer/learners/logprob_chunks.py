"""Label log-probabilities from hidden states in token chunks, without a tokens x vocabulary tensor kept.

A causal LM's last step is ``logits = lm_head(h)``, a ``(tokens, V)`` float32 tensor once cast for the
log-softmax: one 16k-token row of a 152k-vocabulary model is 10 GB, about 30 GB with the softmax
copy and the gradient. :func:`chunked_label_logprobs` projects ``chunk_tokens`` hidden states at a
time, takes their processed log-probabilities (:func:`agentenv.engines.sampling.label_logprobs`:
temperature, top-k, top-p exactly as the engine sampled), and keeps only the ``(tokens,)`` results;
under autograd each chunk is wrapped in non-reentrant activation checkpointing, so the backward pass
recomputes the chunk's logits from its hidden states instead of keeping them. At most one chunk's
``(chunk_tokens, V)`` logits (and their softmax and gradient) is alive at any time. Values and
gradients are those of the single pass up to float summation order (``tests/trainer/test_logprob_chunks.py``).

:func:`split_head` finds the decoder and the head of a transformers causal LM whose logits are the
plain ``lm_head(hidden)`` (Llama, Qwen2, Mistral, SmolLM...); a model that scales or soft-caps its
logits, or anything else, gets None and is scored by its own forward pass.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from agentenv.engines.sampling import SamplingTransform, label_logprobs

__all__ = ["DEFAULT_CHUNK_TOKENS", "chunked_label_logprobs", "split_head"]

#: Tokens per vocabulary projection by default: a (1024, V) float32 chunk is 200 MB at V = 49k, 620 MB at 152k.
DEFAULT_CHUNK_TOKENS = 1024

#: Config attributes of models whose logits are not ``lm_head(hidden)`` (Gemma 2's soft cap, Cohere's scale).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def split_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """``(decoder, lm_head)`` of a transformers causal LM whose logits are ``lm_head(last_hidden_state)``.

    Returns:
        The decoder (returns ``.last_hidden_state`` of shape ``(b, L, H)``, after the final norm) and
        the ``torch.nn.Linear`` head, or None when the model is not such a model (a wrapper, a
        DeepSpeed engine, a model whose config scales or soft-caps the logits).
    """
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    head = model.get_output_embeddings()
    decoder = getattr(model, "model", None)
    if not isinstance(head, torch.nn.Linear) or not isinstance(decoder, torch.nn.Module):
        return None
    config = model.config.get_text_config(decoder=True)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORMS):
        return None
    return decoder, head


def chunked_label_logprobs(
    hidden: torch.Tensor,
    head: torch.nn.Linear,
    labels: torch.Tensor,
    transform: SamplingTransform | None,
    chunk_tokens: int,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``log pi(label)`` under ``transform`` from hidden states, ``chunk_tokens`` tokens at a time.

    Args:
        hidden: ``(b, k, H)`` final hidden states at the label positions (any float dtype). b: rows,
            k: label positions, H: hidden size.
        head: The vocabulary projection ``(H) -> (V)``.
        labels: ``(b, k)`` int64 token ids in ``[0, V)``.
        transform: The behaviour processing (None: the identity).
        chunk_tokens: Tokens (``b * k`` flattened) projected at a time, > 0.
        with_entropy: Also return the entropy of the processed distribution (nats), without gradient.

    Returns:
        ``(logprobs (b, k) float32 nats, entropy (b, k) float32 nats or None)``, equal to
        ``label_logprobs(head(hidden), labels, transform)``; the gradient reaches ``hidden`` and the
        head's parameters, the logits of each chunk recomputed in the backward pass.

    Raises:
        ValueError: ``chunk_tokens < 1``.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    b, k, width = hidden.shape
    flat_hidden = hidden.reshape(b * k, width)
    flat_labels = labels.reshape(b * k)

    def one_chunk(h: torch.Tensor, lab: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        lp, ent = label_logprobs(head(h).unsqueeze(0), lab.unsqueeze(0), transform, with_entropy=with_entropy)
        return lp.squeeze(0), None if ent is None else ent.squeeze(0)

    track = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in head.parameters()))
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for start in range(0, b * k, chunk_tokens):
        h, lab = flat_hidden[start : start + chunk_tokens], flat_labels[start : start + chunk_tokens]
        lp, ent = checkpoint(one_chunk, h, lab, use_reentrant=False) if track else one_chunk(h, lab)
        lps.append(lp)
        if ent is not None:
            ents.append(ent)
    lp = torch.cat(lps).view(b, k) if lps else hidden.new_zeros(b, k, dtype=torch.float32)
    ent = None
    if with_entropy:
        ent = torch.cat(ents).view(b, k) if ents else hidden.new_zeros(b, k, dtype=torch.float32)
    return lp, ent
