"""Sandbox benchmarks: per-call overhead, start time (cold vs warm pool), 16-way throughput, idle RSS.

Baseline measured in the same run: spawning a bare ``python3 -c pass`` (what a non-persistent
sandbox would pay per call at the very least). Bounded: a fixed number of calls per figure.

    .venv/bin/python benchmarks/bench_sandboxes.py [--backends process,bwrap,docker] [--calls 200]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

from agentenv.sandboxes import SandboxLimits, available_backends, create_sandbox, create_sandbox_pool

LIMITS = SandboxLimits(timeout_s=30.0)
PYTHON = "/usr/bin/python3"  # the interpreter the process and bwrap workers run


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def ms(x: float) -> str:
    return f"{x * 1e3:.2f} ms"


def bare_spawn(n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([PYTHON, "-c", "pass"], check=True)
        out.append(time.perf_counter() - t0)
    return out


def rss_of_pids(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            pass
    return total


def sandbox_rss(sb) -> int:
    """Resident bytes of every host process of one idle sandbox."""
    state = sb._handle.state
    if sb.backend == "docker":
        top = state.container.top()
        col = top["Titles"].index("PID")
        return rss_of_pids([int(p[col]) for p in top["Processes"]])
    from agentenv.sandboxes.hostproc import pids_of_uid

    if state.uid is not None:
        return rss_of_pids(pids_of_uid(state.uid))
    return rss_of_pids([state.proc.pid])


async def bench_backend(backend: str, calls: int, starts: int) -> dict:
    res: dict = {"backend": backend}
    # cold start: one sandbox at a time, nothing pre-started
    cold = []
    for _ in range(starts):
        t0 = time.perf_counter()
        sb = await create_sandbox(backend, LIMITS)
        cold.append(time.perf_counter() - t0)
        await sb.close()
    res["start_cold_median"] = statistics.median(cold)
    # per-call overhead of the persistent worker
    sb = await create_sandbox(backend, LIMITS)
    await sb.run("x = 0")
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        r = await sb.run("x += 1")
        lat.append(time.perf_counter() - t0)
        assert r.ok, r
    res["call_median"], res["call_p95"] = statistics.median(lat), pct(lat, 0.95)
    res["rss_idle"] = sandbox_rss(sb)
    await sb.close()
    # warm pool: acquire() latency once the pool has started ahead
    pool = create_sandbox_pool(backend, size=4, limits=LIMITS)
    await pool.start()
    warm = []
    for _ in range(starts):
        while pool._ready.qsize() < 1:  # bounded by the pool's own refill (starts in background)
            await asyncio.sleep(0.01)
        t0 = time.perf_counter()
        sb = await pool.acquire()
        warm.append(time.perf_counter() - t0)
        await pool.release(sb)
        await asyncio.sleep(0)
    res["start_warm_median"], res["warm_waits"] = statistics.median(warm), pool.waits
    await pool.close()
    # throughput: 16 sandboxes, each running calls//8 snippets concurrently
    pool = create_sandbox_pool(backend, size=16, limits=LIMITS)
    t0 = time.perf_counter()
    await pool.start()
    res["start16"] = time.perf_counter() - t0
    sbs = [await pool.acquire() for _ in range(16)]
    per = max(calls // 8, 5)

    async def drive(s):
        for _ in range(per):
            r = await s.run("y = sum(range(1000))")
            assert r.ok, r

    t0 = time.perf_counter()
    await asyncio.gather(*(drive(s) for s in sbs))
    res["throughput16"] = 16 * per / (time.perf_counter() - t0)
    await pool.close()
    return res


async def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="process,bwrap,docker")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--starts", type=int, default=8)
    args = ap.parse_args(argv)
    avail = available_backends()
    spawn = bare_spawn(20)
    base = statistics.median(spawn)
    print(f"baseline: bare `{PYTHON} -c pass` spawn median {ms(base)}, p95 {ms(pct(spawn, 0.95))}")
    for backend in args.backends.split(","):
        if avail[backend]:
            print(f"{backend}: skipped ({avail[backend]})")
            continue
        r = await bench_backend(backend, args.calls if backend != "docker" else args.calls // 2, args.starts)
        print(f"{backend}: call overhead median {ms(r['call_median'])} p95 {ms(r['call_p95'])} "
              f"(x{r['call_median'] / base:.4f} of a bare spawn); start cold {ms(r['start_cold_median'])}, "
              f"warm-pool acquire {ms(r['start_warm_median'])} (waits {r['warm_waits']}, "
              f"x{r['start_warm_median'] / r['start_cold_median']:.4f} of cold); 16 sandboxes start "
              f"{r['start16']:.2f} s, throughput {r['throughput16']:.0f} calls/s; idle RSS "
              f"{r['rss_idle'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
