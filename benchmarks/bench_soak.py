"""Soak: 64 concurrent python_tool episodes for N minutes; memory, open files and child processes must not grow.

A :class:`~agentenv.rollout.collector.RolloutCollector` keeps ``--concurrency`` episodes of the real
``PythonToolEnv`` in flight (real ``process`` sandbox workers, one started per episode, and the real
math-verify grading workers), back to back, until ``--minutes`` have passed or ``--max-episodes``
finished (whichever comes first; it stops by itself). The policy is scripted (two tool calls, ``x =
6 * 7`` and ``print(x)``, then ``\\boxed{42}``, 50 ms per reply), so every part of an episode but the
model runs for real and every episode must earn reward 1. Each good trajectory goes to a
``TrajectoryPool`` from which batches of 64 are taken as soon as there are 64 (a learner that never
waits), so trajectories do not pile up.

Sampled every ``--sample-s`` seconds (default 10): resident memory of this process and of all its
descendants (``/proc``), its open file descriptors, its live descendant processes. After the first
minute (imports, first workers) the resident memory's least-squares slope must stay under
``--max-slope`` MiB per minute (default 2), and the open descriptors and processes of the second half
must not exceed the first half's maximum by more than a few (``--slack``). Prints the figures and
PASS/FAIL, writes the curve as a PNG (``--png``, default ``docs/soak_memory.png``).

Usage: ``python benchmarks/bench_soak.py --minutes 10``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan  # noqa: E402
from agentenv.envs.python_tool import PythonToolEnv  # noqa: E402
from agentenv.envs.python_tool.datasets import MathProblem  # noqa: E402
from agentenv.envs.python_tool.grading import Grader  # noqa: E402
from agentenv.faults import FAULTS  # noqa: E402
from agentenv.rollout.collector import RolloutCollector  # noqa: E402
from agentenv.rollout.episode import RolloutConfig  # noqa: E402
from agentenv.rollout.pool import TrajectoryPool  # noqa: E402
from agentenv.rollout.staleness import StalenessConfig  # noqa: E402
from tests.fakes import EOT, CharRenderer  # noqa: E402

SOAK_PROBLEM = MathProblem("soak/0", "What is 6 times 7?", "42", "soak")
_CALL = '<tool_call>{{"name": "python", "arguments": {{"code": "{}"}}}}</tool_call>'
SCRIPT = [_CALL.format("x = 6 * 7"), _CALL.format("print(x)"), "It is \\boxed{42}."]
PAGE = os.sysconf("SC_PAGE_SIZE")


class ToolScriptEngine:
    """A scripted policy for python_tool (CharRenderer ids): the reply after ``k`` replies is ``SCRIPT[k]``."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return 100_000

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        await asyncio.sleep(self.delay_s)
        ids = [ord(c) for c in SCRIPT[min(list(prompt_ids).count(EOT), 2)]] + [EOT]
        return GenerationOutput(ids, [-0.5] * len(ids), [TokenSpan(len(ids), self._version, self._version)], "stop")

    async def update_weights(self, weights, version) -> None:
        self._version = version

    async def close(self) -> None:
        pass


def descendants(root: int) -> list[int]:
    """Live pids below ``root`` (one pass over ``/proc``)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] not in ("Z", "X"):
                parent[int(name)] = int(fields[1])
    out, frontier = [], [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        frontier += kids
    return out


def rss_mib(pid: int | str = "self") -> float:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except OSError:
        return 0.0


def sample(t0: float, episodes: int) -> dict:
    kids = descendants(os.getpid())
    return {"min": (time.monotonic() - t0) / 60, "rss": rss_mib(), "children_rss": sum(rss_mib(k) for k in kids),
            "fds": len(os.listdir("/proc/self/fd")), "children": len(kids), "episodes": episodes}


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


async def soak(args: argparse.Namespace) -> list[dict]:
    grader = Grader(workers=2)
    pool = TrajectoryPool(StalenessConfig(policy="none"))
    stats = {"delivered": 0, "bad": 0, "batches": 0}

    def on_traj(traj) -> None:
        stats["delivered"] += 1
        stats["bad"] += traj.reward != 1.0
        pool.add(traj)
        if len(pool) >= args.concurrency:  # the learner takes a batch at once
            pool.select_batch(args.concurrency, 0)
            stats["batches"] += 1

    collector = RolloutCollector(
        lambda: PythonToolEnv(problems=[SOAK_PROBLEM], sandbox_backend="process", grader=grader, pool_size=0),
        ToolScriptEngine(), CharRenderer(), RolloutConfig(max_turns=4, max_total_tokens=4096), on_traj,
        concurrency=args.concurrency)
    t0 = time.monotonic()
    samples = [sample(t0, 0)]
    await collector.start()
    end = t0 + args.minutes * 60
    while time.monotonic() < end and collector.episodes_finished < args.max_episodes and collector.fatal is None:
        await asyncio.sleep(min(args.sample_s, max(0.0, end - time.monotonic())))
        samples.append(sample(t0, collector.episodes_finished))
        s = samples[-1]
        print(f"{s['min']:6.2f} min  rss {s['rss']:7.1f} MiB  children {s['children']:3d} "
              f"({s['children_rss']:7.1f} MiB)  fds {s['fds']:4d}  episodes {s['episodes']}", flush=True)
    await collector.close()
    grader.close()
    await asyncio.sleep(1.0)
    after = sample(t0, collector.episodes_finished)
    counts = collector.report_counts()
    print(f"\nstopped after {samples[-1]['min']:.2f} min: {collector.episodes_finished} episodes "
          f"({collector.episodes_finished / max(samples[-1]['min'] * 60, 1e-9):.1f}/s), "
          f"delivered {stats['delivered']}, "
          f"batches {stats['batches']}, reward != 1: {stats['bad']}, failed {counts['failed_total']}, "
          f"sandbox replacements {FAULTS.total('sandbox_replaced')}, grader kills {FAULTS.total('grader_kills')}")
    print(f"after close: {after['children']} child processes, {after['fds']} open fds")
    samples.append({**after, "closed": True})
    return samples


def verdict(samples: list[dict], args: argparse.Namespace) -> bool:
    live = [s for s in samples if not s.get("closed")]
    steady = [s for s in live if s["min"] >= 1.0] or live[len(live) // 2:]
    mins = [s["min"] for s in steady]
    rss_slope = slope(mins, [s["rss"] for s in steady])
    kids_slope = slope(mins, [s["children_rss"] for s in steady])
    half = live[len(live) // 2:]
    first = live[: len(live) // 2] or live
    fd_ok = max(s["fds"] for s in half) <= max(s["fds"] for s in first) + args.slack
    kid_ok = max(s["children"] for s in half) <= max(s["children"] for s in first) + args.slack
    closed = samples[-1]
    print(f"resident memory (this process): {live[0]['rss']:.1f} -> {live[-1]['rss']:.1f} MiB, "
          f"slope after minute 1 {rss_slope:+.2f} MiB/min (bound {args.max_slope})")
    top = max(s["children_rss"] for s in live)
    print(f"resident memory (descendants): slope {kids_slope:+.2f} MiB/min; max {top:.0f} MiB")
    print(f"open fds: max first half {max(s['fds'] for s in first)}, second half {max(s['fds'] for s in half)}; "
          f"child processes: {max(s['children'] for s in first)}, {max(s['children'] for s in half)} "
          f"(slack {args.slack}); after close {closed['children']} processes")
    ok = rss_slope <= args.max_slope and fd_ok and kid_ok and closed["children"] == 0
    print("PASS" if ok else "FAIL")
    return ok


def plot(samples: list[dict], path: Path, args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    live = [s for s in samples if not s.get("closed")]
    t = [s["min"] for s in live]
    fig, (a, b) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    a.plot(t, [s["rss"] for s in live], marker=".", label="this process")
    a.plot(t, [s["children_rss"] for s in live], marker=".", label="descendants (sandbox + grading workers)")
    a.set_ylabel("resident memory (MiB)")
    a.set_title(f"soak: {args.concurrency} concurrent python_tool episodes, {live[-1]['episodes']} in "
                f"{live[-1]['min']:.1f} min")
    a.legend()
    b.plot(t, [s["fds"] for s in live], marker=".", label="open file descriptors")
    b.plot(t, [s["children"] for s in live], marker=".", label="live child processes")
    b.set_xlabel("minutes")
    b.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to soak (minutes)")
    ap.add_argument("--concurrency", type=int, default=64, help="episodes in flight")
    ap.add_argument("--max-episodes", type=int, default=10**6, help="stop after this many episodes")
    ap.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    ap.add_argument("--max-slope", type=float, default=2.0, help="allowed resident-memory growth (MiB/min)")
    ap.add_argument("--slack", type=int, default=8, help="fds/processes the second half may exceed the first by")
    ap.add_argument("--png", type=Path, default=Path(__file__).resolve().parents[1] / "docs" / "soak_memory.png")
    args = ap.parse_args()
    samples = asyncio.run(soak(args))
    plot(samples, args.png, args)
    return 0 if verdict(samples, args) else 1


if __name__ == "__main__":
    sys.exit(main())
