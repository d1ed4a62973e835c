"""Give large freed tensor memory back to the operating system at once (glibc only).

PyTorch's CPU tensors come from ``malloc``. glibc serves a large request with ``mmap`` and returns
it on ``free``, but it also *raises* its mmap threshold to the size of every such block freed
(up to 32 MiB), after which blocks of that size come from the heap, where freed memory is kept
for reuse and fragments. A training loop that allocates a few hundred MB of activations per update
from several threads (the learner in a worker thread, the engine in its own) then grows its
resident memory update after update without leaking anything. Fixing the threshold turns that
adjustment off: every block of at least ``threshold_bytes`` is mapped and unmapped directly.

The threshold must not be too low either: every mapped block costs page faults and the kernel's
zeroing of its pages. At 1 MiB (the first setting here) each decode step's new KV-cache tensors (a
few MB per layer) were mapped and unmapped, and a held-out evaluation spent 111 s of 197 s in the
kernel; at 32 MiB with two malloc arenas the same 48 episodes took 127 s instead of 184 s
(BENCHMARKS.md, "Engine decode and prefill"). Limiting the arenas (one per thread by default, up to
8 per core) keeps the threads' freed blocks in two shared heaps, where they are reused.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter numbers, from glibc's <malloc.h>
M_ARENA_MAX = -8

__all__ = ["release_free_heap", "return_freed_memory_to_os"]


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, loaded once (raises OSError where there is none to load)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def return_freed_memory_to_os(threshold_bytes: int = 32 << 20, max_arenas: int | None = 2) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` (bytes; at most 32 MiB) for the rest of the process.

    Call it once at process start, before large tensors exist. Costs a page fault per fresh page of a
    tensor of at least that size (measured: see BENCHMARKS.md, "Learner memory").

    Args:
        threshold_bytes: Blocks of at least this size are mapped and unmapped directly.
        max_arenas: glibc malloc arenas (``M_ARENA_MAX``); None leaves glibc's default.

    Returns:
        True when glibc accepted the threshold; False elsewhere (musl, macOS: nothing changes).
    """
    try:
        libc = _libc()
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
        if ok and max_arenas is not None:
            libc.mallopt(M_ARENA_MAX, int(max_arenas))
    except (OSError, AttributeError):
        ok = False
    logger.debug("mallopt(M_MMAP_THRESHOLD, %d), arenas %s: %s", threshold_bytes, max_arenas, ok)
    return ok


def release_free_heap() -> bool:
    """Give the free pages of every malloc heap back to the operating system now (``malloc_trim(0)``).

    Blocks below the mmap threshold are freed into per-arena heaps and stay resident there; a
    training loop whose learner step allocates and frees a few GB of such blocks per update (16 rows
    of activations) otherwise sees its resident memory grow from update to update (measured: 13.1 GB
    after the first update, 19.7 GB after the third, without a leak). The recipe calls this after
    each update and each held-out evaluation; it costs milliseconds.

    Returns:
        True when glibc's ``malloc_trim`` ran; False elsewhere.
    """
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True
