"""KV caches a generation engine keeps between requests, so that a prefill recomputes only what is new.

:class:`PrefixCache` holds the prompt prefix consecutive episodes share (the system prompt and tool
schemas); :class:`TurnCache` holds finished replies, which an episode's next turn extends. Both keep
only caches computed by the serving policy version and are cleared by a weight update, so a reused
cache never makes a token's recorded ``prefix_version`` untrue.

Shapes: each cache is a one-row ``DynamicCache`` whose layers hold keys/values of ``(1, H_kv, n, D)``
for the ``n`` token ids it covers.
"""

from __future__ import annotations

import collections
import copy
from collections.abc import Sequence

from transformers import DynamicCache

from agentenv.engines import kv_cache

__all__ = ["TURN_CACHE_BYTES", "PrefixCache", "TurnCache"]


class PrefixCache:
    """The KV cache of the prompt prefix that consecutive requests share, valid for one policy version.

    Every episode of an environment starts with the same system prompt and tool schemas (about 300
    tokens with the python tool), so most of each prefill recomputes the same keys and values. After a
    full prefill, the longest common prefix (in tokens) with the previous prompt is kept when it is at
    least ``min_tokens`` long; a later prompt that starts with it, under the same policy version,
    copies that cache and prefills only its own suffix. A weight update invalidates it (the cache was
    computed by older weights), so ``prefix_version`` stays truthful: a reused prefix is always of the
    serving version.

    Args:
        min_tokens: Shortest prefix worth keeping (tokens).
    """

    def __init__(self, min_tokens: int = 32) -> None:
        self.min_tokens = min_tokens
        self.ids: tuple[int, ...] = ()
        self.cache: DynamicCache | None = None
        self.version = -1
        self._last: tuple[int, ...] = ()

    def serves(self, ids: Sequence[int], version: int) -> bool:
        """Whether the kept prefix is of ``version`` and a strict prefix of ``ids`` (a suffix is left)."""
        n = len(self.ids)
        return bool(n) and self.version == version and len(ids) > n and tuple(ids[:n]) == self.ids

    def remember(self, ids: Sequence[int], cache: DynamicCache, version: int) -> None:
        """After a full prefill of ``ids`` into ``cache`` (one row): keep the prefix it shares with the last one."""
        ids = tuple(ids)
        last, self._last = self._last, ids
        n = 0
        for a, b in zip(ids, last, strict=False):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)
        if n < self.min_tokens:
            return
        kept = copy.deepcopy(cache)
        kept.crop(n - len(ids))  # transformers >= 5.2x: a negative count of trailing tokens to drop
        self.ids, self.cache, self.version = ids[:n], kept, version


#: Default byte bound of the turn cache: about 2.9k tokens of SmolLM2-135M's float32 KV (46 kB a token), the
#: latest 7 replies of the default recipe. Only replies whose episode waits on its environment are taken again;
#: an episode's last reply never is, so a larger bound mostly keeps those (0.2 GB more at the run's peak).
TURN_CACHE_BYTES = 128 << 20


class TurnCache:
    """KV caches of finished replies, so that an episode's next turn prefills only what was appended.

    In a multi-turn episode the next prompt is the previous prompt, the reply just sampled and the
    observation. When a row finishes, its KV cache (the prompt and the reply's tokens but the last,
    one row, unpadded) is kept here under the ids it covers; a later request whose prompt extends
    those ids, under the same policy version, takes the cache (each is used once) and prefills only
    the rest: the reply's last token and the observation. Only caches computed entirely by the
    serving weights are kept, and a weight update clears them, so ``prefix_version`` stays truthful.

    Args:
        capacity: Caches kept (the oldest is dropped first); 0 disables the cache.
        max_bytes: Most bytes of keys and values kept over all caches (the oldest dropped first); a
            cache larger than this alone is not kept. None: no byte bound.

    Attributes:
        nbytes: Bytes of keys and values now kept.
    """

    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._entries: collections.OrderedDict[tuple[int, ...], tuple[DynamicCache, int, int]] = (
            collections.OrderedDict()
        )

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ids: Sequence[int], cache: DynamicCache, version: int) -> None:
        """Keep ``cache`` (one row holding exactly ``ids``) computed under ``version``."""
        size = kv_cache.nbytes(cache)
        if self.capacity <= 0 or (self.max_bytes is not None and size > self.max_bytes):
            return
        key = tuple(ids)
        self._drop(key)
        self._entries[key] = (cache, version, size)
        self.nbytes += size
        while len(self._entries) > self.capacity or (self.max_bytes is not None and self.nbytes > self.max_bytes):
            self._drop(next(iter(self._entries)))

    def take(self, ids: Sequence[int], version: int) -> tuple[DynamicCache, int] | None:
        """The longest kept cache of ``version`` whose ids are a strict prefix of ``ids``, removed; or None.

        Returns:
            ``(cache, n)``: the cache holds ``ids[:n]``.
        """
        best = None
        for key, (_, v, _) in self._entries.items():
            n = len(key)
            if v == version and n < len(ids) and (best is None or n > len(best)) and tuple(ids[:n]) == key:
                best = key
        if best is None:
            return None
        cache = self._entries[best][0]
        self._drop(best)
        return cache, len(best)

    def clear(self) -> None:
        """Drop every kept cache (after a weight update)."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.nbytes -= entry[2]
