"""Remote environments: per-step overhead against in-process, and 256 concurrent episodes on one server.

1. Overhead. The same env (the example plugin ``examples/GuessNumber-v0``, secrets up to 10^6, so a
   guess of 0 never ends the episode) is stepped ``--steps`` times in this process and through a
   ``RemoteEnv`` on an ``agentenv serve`` process on loopback, alternating in blocks of 50.
   Per-step latency: median and p95 (microseconds); the overhead is remote minus in-process.
2. Concurrency. ``--episodes`` RemoteEnvs (default 256) each play one episode of ``--episode-steps``
   steps at once against one server: aggregate steps/s (steps over the wall time of the whole
   round, resets and closes included) and the server's RSS (MiB) idle before and at its peak during
   the round (sampled every 50 ms with psutil), and the CPU seconds each process used in the round.
   Client and server share this machine's cores.

    .venv/bin/python benchmarks/bench_remote.py [--steps 2000] [--episodes 256] [--episode-steps 20]

Bounded: every call has the client's timeouts, and the whole run stops after ``--deadline-s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test-suite's server launcher
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "guess_number"))

from agentenv.remote import RemoteEnv  # noqa: E402
from tests.remote.serving import GUESS_NUMBER_ID, running  # noqa: E402

HIGH = 1_000_000


def quantiles(xs: list[float]) -> tuple[float, float]:
    """Median and p95 (nearest rank) of ``xs``."""
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


async def timed_steps(env, n: int, out: list[float]) -> None:
    for _ in range(n):
        t = time.perf_counter()
        await env.step("0")
        out.append(time.perf_counter() - t)


async def overhead(url: str, steps: int) -> dict[str, float]:
    import agentenv_guess_number

    local = agentenv_guess_number.GuessNumberEnv(low=1, high=HIGH, max_turns=10 * steps)
    remote = RemoteEnv(GUESS_NUMBER_ID, url)
    for env in (local, remote):
        await env.reset(seed=0)
        await timed_steps(env, 50, [])  # warm-up: connection, first allocations
    times: dict[str, list[float]] = {"local": [], "remote": []}
    for _ in range(steps // 50):
        await timed_steps(local, 50, times["local"])
        await timed_steps(remote, 50, times["remote"])
    await local.close()
    await remote.close()
    (lm, lp), (rm, rp) = quantiles(times["local"]), quantiles(times["remote"])
    return {"steps": len(times["remote"]), "local_median_us": lm * 1e6, "local_p95_us": lp * 1e6,
            "remote_median_us": rm * 1e6, "remote_p95_us": rp * 1e6,
            "overhead_median_us": (rm - lm) * 1e6, "overhead_p95_us": (rp - lp) * 1e6}


async def concurrent(url: str, pid: int, episodes: int, episode_steps: int) -> dict[str, float]:
    proc = psutil.Process(pid)
    idle = proc.memory_info().rss
    peak = [idle]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    envs = [RemoteEnv(GUESS_NUMBER_ID, url, timeout_s=120.0) for _ in range(episodes)]
    latencies: list[float] = []

    async def episode(env: RemoteEnv, seed: int) -> int:
        await env.reset(seed=seed)
        await timed_steps(env, episode_steps, latencies)
        await env.close()
        return episode_steps

    sampler.start()
    cpu_server, cpu_client = sum(proc.cpu_times()[:2]), time.process_time()
    t = time.perf_counter()
    results = await asyncio.gather(*(episode(env, i) for i, env in enumerate(envs)), return_exceptions=True)
    wall = time.perf_counter() - t
    cpu_server, cpu_client = sum(proc.cpu_times()[:2]) - cpu_server, time.process_time() - cpu_client
    done.set()
    sampler.join()
    failed = [r for r in results if isinstance(r, BaseException)]
    steps = sum(r for r in results if isinstance(r, int))
    med, p95 = quantiles(latencies)
    return {"episodes": episodes, "episode_steps": episode_steps, "failed_episodes": len(failed),
            "steps": steps, "wall_s": wall, "steps_per_s": steps / wall, "step_median_ms": med * 1e3,
            "step_p95_ms": p95 * 1e3, "server_rss_idle_mib": idle / 2**20, "server_rss_peak_mib": peak[0] / 2**20,
            "server_cpu_s": cpu_server, "client_cpu_s": cpu_client,
            "first_error": repr(failed[0])[:200] if failed else None}


async def main_async(args: argparse.Namespace) -> dict:
    out: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}, "
                            f"load average {os.getloadavg()[0]:.1f} at start"}
    with running("--env-arg", f"high={HIGH}", "--env-arg", f"max_turns={10 * args.steps}") as server:
        out["overhead"] = await overhead(server.url, args.steps)
        out["concurrent"] = await concurrent(server.url, server.pid, args.episodes, args.episode_steps)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=2000, help="timed steps per side for the overhead")
    p.add_argument("--episodes", type=int, default=256, help="concurrent remote episodes")
    p.add_argument("--episode-steps", type=int, default=20, help="steps per concurrent episode")
    p.add_argument("--deadline-s", type=float, default=300.0, help="stop the whole run after this many seconds")
    args = p.parse_args()
    result = asyncio.run(asyncio.wait_for(main_async(args), args.deadline_s))
    o, c = result["overhead"], result["concurrent"]
    print(f"machine: {result['machine']}")
    print(f"per step, {o['steps']} steps: in-process median {o['local_median_us']:.1f} us, "
          f"p95 {o['local_p95_us']:.1f} us;"
          f" remote median {o['remote_median_us']:.0f} us, p95 {o['remote_p95_us']:.0f} us;"
          f" overhead median {o['overhead_median_us']:.0f} us, p95 {o['overhead_p95_us']:.0f} us")
    print(f"{c['episodes']} concurrent episodes x {c['episode_steps']} steps: {c['steps_per_s']:.0f} steps/s "
          f"({c['steps']} steps in {c['wall_s']:.2f} s, {c['failed_episodes']} failed); step median "
          f"{c['step_median_ms']:.1f} ms, p95 {c['step_p95_ms']:.1f} ms; server RSS {c['server_rss_idle_mib']:.0f} MiB "
          f"idle, {c['server_rss_peak_mib']:.0f} MiB peak; CPU seconds: server {c['server_cpu_s']:.1f}, "
          f"client {c['client_cpu_s']:.1f}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
