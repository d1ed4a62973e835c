"""What the transformers engine keeps in memory: the turn cache's bounds, no reference to sent weights."""

from __future__ import annotations

import gc
import weakref

import torch
from transformers import DynamicCache

from agentenv.engines import kv_cache
from agentenv.engines.prompt_caches import TurnCache
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.models import tiny_random_model


def _cache(tokens: int, layers: int = 2) -> DynamicCache:
    """A one-row float32 cache of ``tokens`` positions, 2 heads of size 4: 64 bytes a token a layer."""
    cache = DynamicCache()
    for i in range(layers):
        cache.update(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4), i)
    return cache


def test_cache_bytes_counts_keys_and_values_of_every_layer():
    assert kv_cache.nbytes(_cache(10)) == 2 * 2 * (2 * 10 * 4) * 4  # layers x (k, v) x elements x 4 bytes


def test_turn_cache_is_bounded_in_entries_and_bytes():
    turns = TurnCache(capacity=3, max_bytes=1280 * 3)  # 1280 bytes = a 10-token cache
    for n in (10, 11, 12):
        turns.put(list(range(n)), _cache(10), version=0)
    assert len(turns) == 3 and turns.nbytes == 3 * 1280
    turns.put(list(range(20)), _cache(20), version=0)  # 2560 bytes: the two oldest go
    assert len(turns) == 2 and turns.nbytes == 1280 + 2560
    assert turns.take(list(range(11)) + [99], version=0) is None  # dropped (oldest first)
    cache, n = turns.take(list(range(12)) + [99], version=0)
    assert n == 12 and turns.nbytes == 2560 and len(turns) == 1
    turns.put([7] * 50, _cache(50), version=0)  # 6400 bytes: more than the bound alone, not kept
    assert len(turns) == 1 and turns.nbytes == 2560
    for n in (3, 4, 5, 6):  # entries bound
        turns.put([1] * n, _cache(1), version=0)
    assert len(turns) == 3 and turns.nbytes == 3 * 128
    turns.put([1] * 3, _cache(2), version=0)  # the same ids again: replaced, counted once
    assert len(turns) == 3 and turns.nbytes == 2 * 128 + 256
    turns.clear()
    assert len(turns) == 0 and turns.nbytes == 0


async def test_engine_lets_go_of_the_weights_it_was_sent():
    engine = TransformersEngine(tiny_random_model(seed=0), max_batch_size=2)
    state = {k: v.clone() for k, v in tiny_random_model(seed=1).state_dict().items()}
    ref = weakref.ref(next(iter(state.values())))
    await engine.update_weights(state, 1)
    del state
    gc.collect()
    assert engine.version == 1 and ref() is None  # the idle decode loop keeps no reference to the update
    await engine.close()
