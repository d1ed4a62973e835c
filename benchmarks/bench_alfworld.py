"""ALFWorld benchmark: reset/step latency of AlfWorldEnv against bare TextWorld, and episodes/minute.

Baseline, measured in the same run on the same games, interleaved game by game: bare TextWorld
(``textworld.start`` with alfworld's AlfredDemangler + AlfredInfos wrappers, a new game per reset,
as alfworld's own loader does); reset = start + reset, step = ``env.step``. Ours: ``await
AlfWorldEnv.reset/step`` (thread hop, lock, command parsing, observation formatting).
Episodes/minute: the walkthrough oracle through ``agentenv.evaluation.run_jobs`` with 1, 4 and 8
concurrent games in one process, and ``run_oracle`` with 2 processes x 2 games.

    .venv/bin/python benchmarks/bench_alfworld.py [--games 12] [--episodes 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import textworld
from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

from agentenv.envs.alfworld import AlfWorldEnv, list_games, read_game
from agentenv.envs.alfworld.oracle import run_oracle, walkthrough_policy
from agentenv.evaluation import make_jobs, policy_agent, run_jobs


def q(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def bare_game(g, walk, resets: list[float], steps: list[float]) -> None:
    infos = textworld.EnvInfos(won=True, admissible_commands=True)
    t = time.perf_counter()
    env = textworld.start(str(g.path), request_infos=infos, wrappers=[AlfredDemangler(), AlfredInfos])
    env.reset()
    resets.append(time.perf_counter() - t)
    for c in walk:
        t = time.perf_counter()
        env.step(c)
        steps.append(time.perf_counter() - t)
    env.close()


async def our_game(env: AlfWorldEnv, i: int, walk, resets: list[float], steps: list[float]) -> None:
    t = time.perf_counter()
    await env.reset(options={"game": i})
    resets.append(time.perf_counter() - t)
    for c in walk:
        t = time.perf_counter()
        await env.step(c)
        steps.append(time.perf_counter() - t)


async def latencies(games, walks) -> tuple[list[float], ...]:
    """Bare and ours interleaved game by game, so that machine load hits both alike."""
    br, bs, orr, os_ = [], [], [], []
    async with AlfWorldEnv(games=games) as env:
        for i, walk in enumerate(walks):
            bare_game(games[i], walk, br, bs)
            await our_game(env, i, walk, orr, os_)
    return br, bs, orr, os_


async def throughput(games, n: int, concurrency: int) -> float:
    jobs = make_jobs([(g.name, g.task_type) for g in games], limit=n)
    t = time.perf_counter()
    res = await run_jobs(
        jobs,
        policy_agent(walkthrough_policy(games)),
        lambda: AlfWorldEnv(games=games),
        concurrency=concurrency,
        progress=False,
    )
    assert all(r.won for r in res), [r for r in res if not r.won]
    return 60 * len(res) / (time.perf_counter() - t)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--games", type=int, default=12, help="games for the latency figures")
    p.add_argument("--episodes", type=int, default=16, help="episodes per throughput figure")
    args = p.parse_args()
    all_games = list_games("valid_seen")
    games = all_games[:: max(1, len(all_games) // args.games)][: args.games]  # spread over task types
    walks = [read_game(g.path)["walkthrough"] for g in games]
    br, bs, orr, os_ = asyncio.run(latencies(games, walks))
    print(f"{len(games)} games, {len(bs)} steps each way")
    print(f"{'':22} {'median':>9} {'p95':>9}")
    for name, xs in [("bare TextWorld reset", br), ("AlfWorldEnv reset", orr)]:
        m, p95 = q(xs)
        print(f"{name:22} {m * 1e3:8.1f}ms {p95 * 1e3:8.1f}ms")
    for name, xs in [("bare TextWorld step", bs), ("AlfWorldEnv step", os_)]:
        m, p95 = q(xs)
        print(f"{name:22} {m * 1e3:8.1f}ms {p95 * 1e3:8.1f}ms")
    print(f"ratio ours/bare: reset median {q(orr)[0] / q(br)[0]:.2f}, step median {q(os_)[0] / q(bs)[0]:.2f}")
    spread = all_games[:: max(1, len(all_games) // args.episodes)][: args.episodes]
    for c in (1, 4, 8):
        rate = asyncio.run(throughput(spread, len(spread), c))
        print(f"episodes/min, {c} concurrent games (threads, one process): {rate:.1f}")
    t = time.perf_counter()
    report, _ = run_oracle("valid_seen", limit=2 * len(spread), workers=2, concurrency=2, progress=False)
    assert report.overall.successes == 2 * len(spread)
    rate = 60 * 2 * len(spread) / (time.perf_counter() - t)
    print(f"episodes/min, 2 processes x 2 games (run_oracle, first {2 * len(spread)} games): {rate:.1f}")


if __name__ == "__main__":
    main()
