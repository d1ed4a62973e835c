"""Give freed tensor memory back to the operating system at once (glibc only).

PyTorch's CPU tensors come from ``malloc``. glibc serves a large request with ``mmap`` and returns
it on ``free``, but it also *raises* its mmap threshold to the size of every such block freed
(up to 32 MiB), after which blocks of that size come from the heap, where freed memory is kept
for reuse and fragments. A training loop that allocates a few hundred MB of activations per update
from several threads (the learner in a worker thread, the engine in its own) then grows its
resident memory update after update without leaking anything. Fixing the threshold turns that
adjustment off: every block of at least ``threshold_bytes`` is mapped and unmapped directly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter number, from glibc's <malloc.h>

__all__ = ["return_freed_memory_to_os"]


def return_freed_memory_to_os(threshold_bytes: int = 1 << 20) -> bool:
    """Fix glibc's mmap threshold at ``threshold_bytes`` (bytes) for the rest of the process.

    Call it once at process start, before large tensors exist. Costs a page fault per fresh page of a
    large tensor (measured: see BENCHMARKS.md, "Learner memory").

    Returns:
        True when glibc accepted the setting; False elsewhere (musl, macOS: nothing changes).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        ok = bool(libc.mallopt(M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):
        ok = False
    logger.debug("mallopt(M_MMAP_THRESHOLD, %d): %s", threshold_bytes, ok)
    return ok
