"""The token prefix every row of a batch shares, run once and attended to by every micro-batch.

A batch of agent trajectories starts with the same system prompt and tool schemas. The learner runs
those ``n`` tokens once as a ``(1, n)`` pass and keeps each layer's keys and values; every
micro-batch then runs only its rows' ``(b, L - n)`` suffixes against that KV cache, repeated to its
``b`` rows. Under autograd the per-layer K/V come in two forms:

* ``leaves=False``: the cache is the prefix pass's own output, so a micro-batch's ``backward()``
  flows into the prefix directly (one micro-batch, the prefix graph freed with it);
* ``leaves=True``: the cache is a detached copy whose tensors require gradient. Every micro-batch's
  ``backward()`` accumulates into the copies' ``.grad`` and stops there, so the prefix pass's graph
  stays alive (one row of ``n`` tokens) and is back-propagated once, by :meth:`SharedPrefix.backward`,
  after the last micro-batch. The gradient is the same sum over rows as with one pass.

Shapes: per layer, keys and values are ``(1, H_kv, n, D)``: H_kv key/value heads, n prefix tokens,
D head size.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import DynamicCache

__all__ = ["SharedPrefix"]


class SharedPrefix:
    """The KV cache of a shared token prefix (see the module docstring).

    Args:
        model: The module to run (a transformers causal LM or its decoder), taking a ``DynamicCache``.
        config: The model config (``DynamicCache(config=...)``).
        prefix_ids: ``(n,)`` long token ids of the prefix.
        leaves: Keep the K/V as gradient leaves, back-propagated once by :meth:`backward`.

    Attributes:
        length: ``n``, prefix tokens.
    """

    def __init__(self, model: torch.nn.Module, config: object, prefix_ids: torch.Tensor, *, leaves: bool) -> None:
        from transformers import DynamicCache

        from agentenv.engines.kv_cache import cache_keyword

        self._config = config
        self.length = int(prefix_ids.numel())
        cache = DynamicCache(config=config)
        kw = {cache_keyword(model): cache}
        if "logits_to_keep" in _parameters(model):
            kw["logits_to_keep"] = 1
        device = next(model.parameters()).device
        model(input_ids=prefix_ids.reshape(1, -1).to(device), use_cache=True, **kw)
        self._graph = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        tracked = leaves and torch.is_grad_enabled() and any(t.requires_grad for t in self._graph)
        # a frozen layer's K/V (its weights and all below take no gradient) stays a constant, not a leaf
        self._kv = [t.detach().requires_grad_(t.requires_grad) for t in self._graph] if tracked else list(self._graph)
        self._leaves = tracked

    def cache(self, rows: int) -> DynamicCache:
        """A new cache holding the prefix repeated to ``rows`` rows (differentiably, to the prefix's K/V)."""
        from transformers import DynamicCache

        out = DynamicCache(config=self._config)
        for layer_idx in range(len(self._kv) // 2):
            keys, values = self._kv[2 * layer_idx], self._kv[2 * layer_idx + 1]
            out.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), layer_idx)
        return out

    def surrogate_loss(self) -> torch.Tensor:
        """A scalar whose gradient w.r.t. the parameters is the prefix pass's back-propagation, then free it.

        ``sum_l <K/V_l, dL/dK/V_l>`` over the prefix's layers, with the gradient accumulated on the
        leaves held constant: its backward sends exactly that gradient through the prefix pass, as
        :meth:`backward` does, but through a caller's own backward (DeepSpeed's ``engine.backward``,
        which must see every backward to reduce the gradients). A leaf no micro-batch reached counts
        with a zero gradient, so the pass is back-propagated (with zeros) all the same: every
        data-parallel rank then reduces the same parameters.

        Raises:
            RuntimeError: Built without ``leaves=True``, or already back-propagated.
        """
        if not self._leaves or not self._graph:
            raise RuntimeError("surrogate_loss needs a prefix built with leaves=True, not yet back-propagated")
        terms = [(g * (k.grad if k.grad is not None else torch.zeros_like(g))).sum()
                 for g, k in zip(self._graph, self._kv, strict=True)]
        self._graph, self._kv = [], []
        return torch.stack(terms).sum()

    def backward(self) -> None:
        """Back-propagate the gradient accumulated on the leaves through the prefix pass, then free it.

        A no-op without leaves or when no micro-batch reached them.
        """
        pairs = [(g, k.grad) for g, k in zip(self._graph, self._kv, strict=True)] if self._leaves else []
        pairs = [(g, grad) for g, grad in pairs if grad is not None]
        if pairs:
            torch.autograd.backward([g for g, _ in pairs], grad_tensors=[grad for _, grad in pairs])
        self._graph, self._kv = [], []


def _parameters(model: torch.nn.Module) -> tuple[str, ...]:
    return tuple(inspect.signature(model.forward).parameters)
