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

Freed blocks below the threshold stay resident until ``malloc_trim`` returns their pages; a training
run trims on a clock (:class:`HeapTrimmer`), because its two busy threads refill free pages faster
than any fixed point in the loop could return them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading

logger = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3  # mallopt parameter numbers, from glibc's <malloc.h>
M_ARENA_MAX = -8

__all__ = ["HeapTrimmer", "release_free_heap", "return_freed_memory_to_os"]


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
    after the first update, 19.7 GB after the third, without a leak). The learner calls it before
    each step, and ``agentenv train`` every half second (:class:`HeapTrimmer`); one call takes about
    20 ms on a training run's heap of a few GB.

    Returns:
        True when glibc's ``malloc_trim`` ran; False elsewhere.
    """
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):
        return False
    return True


class HeapTrimmer:
    """A daemon thread that calls :func:`release_free_heap` every ``period_s`` seconds while in use.

    A training run keeps freeing blocks below the mmap threshold from two threads at once (the
    learner's activations, the engine's KV caches), and glibc keeps every freed page resident until
    a trim: in the default run the heap held 2-3 GB of free, resident pages beside 2.3 GB in use
    between updates, and the peak resident set sat about 2 GB above the peak in use. Trimming only
    at fixed points (before the step, after it, before each micro-batch) did not lower the peak,
    because the other thread refills the free pages within seconds; trimming on a clock does
    (BENCHMARKS.md, "A training run's memory"). One trim takes about 20 ms on that heap (p95 50 ms)
    and briefly holds the allocator's locks.

    Use as a context manager (``with HeapTrimmer(): ...``); does nothing where glibc is absent.

    Args:
        period_s: Seconds between trims (> 0).

    Raises:
        ValueError: ``period_s`` is not positive.
    """

    def __init__(self, period_s: float = 0.5) -> None:
        if not period_s > 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.period_s = period_s
        self.trims = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> HeapTrimmer:
        if release_free_heap():  # the first trim also tells whether glibc is there
            self.trims = 1
            self._thread = threading.Thread(target=self._run, name="heap-trimmer", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            release_free_heap()
            self.trims += 1
