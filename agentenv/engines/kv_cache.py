"""A left-padded batch KV cache for continuous batching on top of transformers' ``DynamicCache``.

Each request is prefilled alone (no padding inside a prefill, so no fully masked query rows), then its
cache is merged into the running batch by left-padding every row to a common length with zeros. Row
``i`` holds ``n_i`` real positions at the right end of a cache of length ``L``; the 2-D attention mask
is 0 on the ``L - n_i`` left pad columns and the row's position ids count only its real tokens, so the
padding never changes a row's numbers. Rows that finish are dropped, and pad columns that every row
has are trimmed away.

Shapes: every layer's keys/values are ``(B, H_kv, L, D)``: B rows, H_kv key/value heads, L cached
positions, D head size.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from agentenv.errors import EngineError


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which ``model.forward`` takes a KV cache (``cache``, or the older ``past_key_values``)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def check_plain_layers(cache: DynamicCache) -> None:
    """Raise EngineError unless every layer is a plain (full-attention) ``DynamicLayer``.

    Sliding-window or indexed layers keep extra state that left-padding would corrupt.
    """
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise EngineError(
                f"the transformers engine supports full-attention KV caches only, got {type(layer).__name__}"
            )


def merge(caches: Sequence[DynamicCache], lengths: Sequence[int]) -> DynamicCache:
    """Concatenate caches along the batch, left-padding each to the longest.

    Args:
        caches: Caches of ``b_j`` rows and length ``L_j`` each (the first one is reused for the result).
        lengths: ``L_j`` of each cache (its ``get_seq_length()``).

    Returns:
        One cache of ``sum_j b_j`` rows and length ``max_j L_j``.
    """
    total = max(lengths)
    out = caches[0]
    for layer_idx, layer in enumerate(out.layers):
        for attr in ("keys", "values"):
            parts = []
            for cache, length in zip(caches, lengths, strict=True):
                t = getattr(cache.layers[layer_idx], attr)
                if length < total:
                    pad = t.new_zeros(*t.shape[:-2], total - length, t.shape[-1])
                    t = torch.cat([pad, t], dim=-2)
                parts.append(t)
            setattr(layer, attr, torch.cat(parts, dim=0) if len(parts) > 1 else parts[0])
    return out


def select_rows(cache: DynamicCache, keep: Sequence[int], trim: int) -> None:
    """Keep only rows ``keep`` (in that order) and drop the first ``trim`` (all-padding) columns, in place."""
    index = torch.tensor(list(keep), dtype=torch.long, device=cache.layers[0].keys.device)
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, index)[..., trim:, :]
        layer.values = layer.values.index_select(0, index)[..., trim:, :]


def row(cache: DynamicCache, index: int, length: int, config: object) -> DynamicCache:
    """A new one-row, unpadded cache holding row ``index``'s last ``length`` positions (copied).

    Args:
        cache: A left-padded batch cache (see the module docstring).
        index: The row.
        length: Its real positions (the right end of the cache).
        config: The model config (``DynamicCache(config=...)``).
    """
    out = DynamicCache(config=config)
    for layer_idx, layer in enumerate(cache.layers):
        keys = layer.keys[index : index + 1, :, layer.keys.shape[-2] - length :, :].clone()
        values = layer.values[index : index + 1, :, layer.values.shape[-2] - length :, :].clone()
        out.update(keys, values, layer_idx)
    return out


def nbytes(cache: DynamicCache) -> int:
    """Bytes held by the keys and values of every layer of ``cache``."""
    return sum(
        t.numel() * t.element_size()
        for layer in cache.layers
        for t in (layer.keys, layer.values)
        if isinstance(t, torch.Tensor)
    )


def attention_mask(real_lengths: Sequence[int], total: int, device: torch.device) -> torch.Tensor:
    """``(B, total)`` long mask: row ``i`` is 0 on its ``total - real_lengths[i]`` pad columns, 1 after."""
    n = torch.tensor(list(real_lengths), device=device)
    cols = torch.arange(total, device=device)
    return (cols.unsqueeze(0) >= (total - n).unsqueeze(1)).long()
