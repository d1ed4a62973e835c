"""Selection time of the trajectory pool per policy, for pools of 1,000 and 10,000 trajectories.

Baseline: the ``none`` policy (take the B oldest) measured in the same run; the ratio is
``policy time / none time``. ``pace`` (scoring) is timed with a scorer that returns precomputed
log-probabilities, so the figure is the pool's own work (rank, weights, budget, drift reduction over
the older-segment tokens), not the learner's forward pass. Every repetition works on a fresh copy of
the same full pool (untimed copy), with the smoothed rate reset to 0.1 (budget ~19% of the pool) so
every PACE call rejects and the full PACE path runs. ``pace`` computes the drift of every
multi-version candidate from the scorer's arrays in that call (token work: ~5M policy tokens at
10,000 trajectories); ``pace_cached`` has the drift already computed at this version, so its figure
is the selection logic alone. Wall-clock medians and the thread's CPU-time medians are both printed:
on a shared, loaded machine the CPU time is the figure that does not count time spent descheduled.

Usage: python benchmarks/bench_pool.py [--sizes 1000 10000] [--reps 30] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from agentenv.rollout.pool import TrajectoryPool
from agentenv.rollout.staleness import StalenessConfig
from agentenv.trajectory import Segment, Trajectory

POLICIES = {
    "none": StalenessConfig(policy="none"),
    "max_lag": StalenessConfig(policy="max_lag", max_lag=6),
    "pace_share": StalenessConfig(policy="pace", drift_mode="token_share"),
    "pace": StalenessConfig(policy="pace", drift_mode="scoring"),
    "pace_cached": StalenessConfig(policy="pace", drift_mode="scoring"),
}


def synth(n: int, tokens_mean: float, v_now: int, rng: np.random.Generator) -> list[Trajectory]:
    """``n`` trajectories with 1-3 segments, lognormal policy-token counts, completion versions <= v_now."""
    out = []
    for i in range(n):
        total = int(max(3, rng.lognormal(np.log(tokens_mean) - 0.5, 1.0)))
        k = int(rng.integers(1, 4))
        cuts = np.sort(rng.choice(np.arange(1, total), size=k - 1, replace=False)) if k > 1 else []
        lens = np.diff(np.concatenate([[0], cuts, [total]])).astype(int).tolist()
        v_c = v_now - int(rng.integers(0, 6))
        v0 = v_c - int(rng.integers(0, 4))
        segs, pos = [], 16
        for j, n_tok in enumerate(lens):
            v = min(v_c, v0 + j)
            segs.append(Segment(pos, pos + n_tok, v, v0))
            pos += n_tok
        length = pos
        out.append(Trajectory(
            token_ids=[1] * length, loss_mask=[0] * 16 + [1] * total,
            behaviour_logprobs=[0.0] * 16 + [-1.0] * total, segments=segs, prompt_length=16,
            task_id=f"t{i}", completion_version=v_c, id=f"b{i}",
        ))
    return out


def bench(policy: str, trajs: list[Trajectory], b: int, reps: int, v_now: int,
          scores: dict[str, np.ndarray]) -> tuple[list[float], list[float], int]:
    base = TrajectoryPool(POLICIES[policy])
    for t in trajs:
        base.add(t)

    def scorer(ts: list[Trajectory]) -> list[np.ndarray]:
        return [scores[t.id] for t in ts]

    if policy == "pace_cached":  # drift already computed at v_now (private call: warm-up only)
        base._drift(np.arange(len(base)), scorer, v_now, score_all=False)
    times, cpu, rejected = [], [], 0
    for _ in range(reps):
        pool = base.copy()  # untimed; every repetition decides on the same full pool
        pool.rate = 0.1
        t0, c0 = time.perf_counter(), time.thread_time()
        sel = pool.select_batch(b, v_now, scorer)
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        assert len(sel.batch) == b
        rejected = len(sel.rejected)
    return times, cpu, rejected


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--tokens-mean", type=float, default=512.0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    v_now = 100
    print(f"batch size {args.batch_size}, mean policy tokens {args.tokens_mean}, {args.reps} reps, median ms")
    print(f"{'pool':>7} {'policy':>11} {'median ms':>10} {'p90 ms':>8} {'x none':>7} {'cpu ms':>8} "
          f"{'x none':>7} {'rejected':>9}")
    for n in args.sizes:
        trajs = synth(n, args.tokens_mean, v_now, rng)
        scores = {t.id: np.minimum(-1.0 + rng.normal(0, 0.1, t.num_policy_tokens), 0.0) for t in trajs}
        base = None
        for policy in POLICIES:
            times, cpu, rejected = bench(policy, trajs, args.batch_size, args.reps, v_now, scores)
            med = statistics.median(times) * 1e3
            p90 = float(np.percentile(times, 90)) * 1e3
            cmed = statistics.median(cpu) * 1e3
            base = (med, cmed) if policy == "none" else base
            print(f"{n:>7} {policy:>11} {med:>10.3f} {p90:>8.3f} {med / base[0]:>7.1f} {cmed:>8.3f} "
                  f"{cmed / base[1]:>7.1f} {rejected:>9}")


if __name__ == "__main__":
    main()
