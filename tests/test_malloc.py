"""glibc's mmap threshold is fixed so that freed tensor memory goes back to the operating system."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

CHILD = r"""
import ctypes, importlib.util, sys, time
# the module alone (importing the agentenv package would allocate and free enough to blur the effect)
spec = importlib.util.spec_from_file_location("malloc_under_test", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
if sys.argv[2] in ("fixed", "trimmed", "untrimmed", "clock"):
    assert module.return_freed_memory_to_os(1 << 20 if sys.argv[2] == "fixed" else 32 << 20)
trimmer = module.HeapTrimmer(0.05).__enter__() if sys.argv[2] == "clock" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20

def touch(p, n):
    ctypes.memset(p, 1, n)

# Free a 16 MiB block (this would raise glibc's dynamic threshold to 16 MiB), then allocate
# 40 blocks of 8 MiB with a 256 KiB block kept after each, then free the big ones: served from the heap,
# they could not be trimmed (the kept blocks pin them); mapped, they leave at once.
big = libc.malloc(16 << 20); touch(big, 16 << 20); libc.free(big)
base = rss_mb()
blocks, keep = [], []
for _ in range(40):
    blocks.append(libc.malloc(8 << 20)); touch(blocks[-1], 8 << 20)
    keep.append(libc.malloc(256 << 10)); touch(keep[-1], 256 << 10)  # from the heap's top: pins what is below
for p in blocks:
    libc.free(p)
if sys.argv[2] == "trimmed":  # 8 MiB blocks are below the 32 MiB threshold: heap blocks, trimmed here
    assert module.release_free_heap()
if trimmer is not None:  # no call here: the trimmer's thread returns them within a period
    trims = trimmer.trims
    time.sleep(0.5)
    assert trimmer.trims > trims
    trimmer.__exit__(None, None, None)
    assert not trimmer._thread.is_alive()
print(rss_mb() - base - 40 * 0.25)
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_blocks_above_the_threshold_leave_the_process():
    import agentenv.malloc

    def grown_mb(mode: str) -> float:
        argv = [sys.executable, "-c", CHILD, agentenv.malloc.__file__, mode]
        return float(subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout)

    assert grown_mb("default") > 200  # glibc's own behaviour: the 320 MiB freed stay resident
    assert grown_mb("fixed") < 32  # with the threshold fixed they leave at once
    assert grown_mb("untrimmed") > 200  # below a 32 MiB threshold they are heap blocks: resident until a trim
    assert grown_mb("trimmed") < 32  # malloc_trim returns them
    assert grown_mb("clock") < 32  # and so does the HeapTrimmer's thread, unasked


def test_heap_trimmer_refuses_a_period_that_is_not_positive():
    from agentenv.malloc import HeapTrimmer

    for period in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="period_s must be > 0"):
            HeapTrimmer(period)
