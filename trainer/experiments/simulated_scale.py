"""The cluster scale by simulation: GPU-hours, staleness and rejections of each policy at a paper's scale.

``python -m agentenv.trainer.experiments.simulated_scale --out docs/studies/simulated_scale`` simulates
a GPU cluster in the shape of the PACE paper's math setting and writes a table (``scale.md``), the
figures (``scale.json``) and the staleness distributions (``staleness.png``).

Every number of the cluster is an assumption, named in :class:`ClusterAssumptions` and printed with the
table: the GPU counts, the batch, the reply lengths, the decode and learner speeds. The papers' own
GPU counts and speeds are not reproduced here; change the assumptions to match a cluster. What the
simulator contributes is the pipeline (engines, pool, staleness policy, learner) replayed event by
event, checked against real runs on the CPU (``agentenv simulate --from-run``); its error there is
passed in as ``--error-band`` and widens the GPU-hours into an interval.

GPU time at equal updates:

- ``sync`` is colocated: all ``gen_gpus + train_gpus`` GPUs generate a batch, then all of them train
  on it (decode spread over every GPU as engine replicas, the learner's step shortened in proportion
  to the GPUs);
- the asynchronous policies are disaggregated: ``gen_gpus`` GPUs generate while ``train_gpus`` train.

GPU-hours per update = GPUs x wall seconds per update / 3600 in both.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from agentenv.errors import ConfigError
from agentenv.trainer.experiments.sim_result import SimResult
from agentenv.trainer.experiments.simulator import SIM_POLICIES, SimConfig, simulate


@dataclass(frozen=True)
class ClusterAssumptions:
    """The simulated cluster and workload; every value is an assumption (seconds, tokens, GPUs).

    Defaults describe a single-turn math setting with an 8B policy in bfloat16 on 16 GPUs of the H100
    class: long reasoning replies (lognormal, mean 3,000 policy tokens, capped at 20,480), B = 128
    trajectories per step (one rollout per prompt), 512 episodes in flight, at most 2B waiting; a decode
    step of ``0.008 + 0.0002 n`` seconds for a replica decoding ``n`` sequences (the weights read once
    per step, about 125 tokens/s for one sequence; each sequence's KV cache read); 12 s per learner step
    on 8 GPUs (about 0.4 M tokens of forward and backward at 40% of peak); 3 s to load new weights into
    the engines. With these, generation and training keep pace with each other in the asynchronous layout
    (about 15 s per batch each), the layout a cluster would be sized to.
    """

    gen_gpus: int = 8
    """GPUs that generate in the asynchronous layout (one engine replica each)."""
    train_gpus: int = 8
    """GPUs that train in the asynchronous layout."""
    batch_size: int = 128
    """B, trajectories per optimizer step."""
    concurrency: int = 512
    """Episodes in flight (asynchronous layout)."""
    max_pool_size: int = 256
    """Back-pressure in the asynchronous layout: no episode starts while this many trajectories wait."""
    tokens_mean: float = 3000.0
    """Mean policy tokens per episode (lognormal)."""
    tokens_sigma: float = 0.8
    """Lognormal shape of the policy tokens."""
    tokens_max: int = 20_480
    """Cap on policy tokens per episode."""
    turns_mean: float = 1.0
    """Mean turns per episode (1: single-turn math)."""
    tool_latency_mean_s: float = 0.0
    """Mean seconds per tool call between turns."""
    prompt_tokens: int = 256
    """Prompt tokens per episode."""
    decode_base_s: float = 0.008
    """Seconds of one decode step of one engine replica, the part that does not grow with the sequences."""
    decode_per_seq_s: float = 0.0002
    """Seconds one sequence adds to its replica's decode step."""
    train_step_s: float = 12.0
    """Seconds per learner step on ``train_gpus`` GPUs."""
    weight_sync_s: float = 3.0
    """Seconds the engines pause to load new weights."""
    max_lag: float = 4.0
    """The ``max_lag`` policy's cap (versions)."""
    updates: int = 200
    """Optimizer steps simulated per policy."""

    def __post_init__(self) -> None:
        """Raises ConfigError for a count below 1 (the simulator checks the rest)."""
        for name in ("gen_gpus", "train_gpus", "batch_size", "concurrency", "updates"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def gpus(self) -> int:
        """GPUs in either layout."""
        return self.gen_gpus + self.train_gpus

    def sim_config(self, policy: str, seed: int) -> SimConfig:
        """The simulator's settings for ``policy``: colocated on every GPU for ``sync``, disaggregated otherwise.

        Replicas share the decode load evenly, so ``G`` replicas decode like one engine whose per-sequence
        cost is ``decode_per_seq_s / G``.
        """
        colocated = policy == "sync"
        replicas = self.gpus if colocated else self.gen_gpus
        train_s = self.train_step_s * self.train_gpus / self.gpus if colocated else self.train_step_s
        return SimConfig(
            policy=policy, batch_size=self.batch_size,
            concurrency=self.batch_size if colocated else self.concurrency,
            num_trajectories=10**9, max_batches=self.updates, seed=seed, tokens_mean=self.tokens_mean,
            tokens_sigma=self.tokens_sigma, tokens_max=self.tokens_max, turns_mean=self.turns_mean,
            tool_latency_mean_s=self.tool_latency_mean_s, prompt_tokens=self.prompt_tokens,
            decode_base_s=self.decode_base_s, decode_per_seq_s=self.decode_per_seq_s / replicas,
            train_step_s=train_s, weight_sync_s=self.weight_sync_s, max_lag=self.max_lag,
            max_pool_size=None if colocated else self.max_pool_size,
        )


@dataclass(frozen=True)
class PolicyAtScale:
    """One policy's figures at scale, mean over seeds (GPU-hours per update with the error band)."""

    policy: str
    gpu_hours_per_update: float
    gpu_hours_low: float
    gpu_hours_high: float
    seconds_per_update: float
    gs_mean: float
    ws_mean: float
    s_p90: float
    s_max: float
    rejection_rate: float
    relative_to_sync: float
    """GPU-hours per update over sync's (1 for sync)."""


def simulate_scale(a: ClusterAssumptions, seeds: int = 3, error_band: float = 0.2,
                   policies: tuple[str, ...] = SIM_POLICIES) -> tuple[list[PolicyAtScale], dict[str, list[SimResult]]]:
    """Simulate every policy on the cluster ``a`` with ``seeds`` seeds.

    Args:
        a: The cluster and workload.
        seeds: Simulator seeds per policy (figures are their means).
        error_band: Relative error of the simulator's time per update (from the calibration on real
            runs); GPU-hours are given as ``value x (1 -+ error_band)``.
        policies: The policies to simulate; ``"sync"`` (the reference) must be among them.

    Returns:
        One :class:`PolicyAtScale` per policy and the raw results per policy.

    Raises:
        ConfigError: ``error_band`` outside [0, 1), ``seeds < 1``, or ``"sync"`` not among ``policies``.
    """
    if not 0 <= error_band < 1 or seeds < 1 or "sync" not in policies:
        raise ConfigError("error_band must be in [0, 1), seeds >= 1, and sync among the policies")
    raw = {p: [simulate(a.sim_config(p, s)) for s in range(seeds)] for p in policies}
    per_update = {p: float(np.mean([r.sim_time_s / r.updates for r in rs])) for p, rs in raw.items()}
    sync_gh = a.gpus * per_update["sync"] / 3600
    rows = []
    for p, rs in raw.items():
        gh = a.gpus * per_update[p] / 3600
        s = [r.summary() for r in rs]
        rows.append(PolicyAtScale(
            policy=p, gpu_hours_per_update=gh, gpu_hours_low=gh * (1 - error_band),
            gpu_hours_high=gh * (1 + error_band), seconds_per_update=per_update[p],
            gs_mean=float(np.mean([x["gs_mean"] for x in s])), ws_mean=float(np.mean([x["ws_mean"] for x in s])),
            s_p90=float(np.mean([x["s_p90"] for x in s])), s_max=float(np.max([x["s_max"] for x in s])),
            rejection_rate=float(np.mean([x["rejection_rate"] for x in s])), relative_to_sync=gh / sync_gh,
        ))
    return rows, raw


def format_scale(rows: list[PolicyAtScale], a: ClusterAssumptions, error_band: float) -> str:
    """The Markdown table of :func:`simulate_scale`'s rows, with the assumptions above it."""
    lines = ["Assumptions: " + ", ".join(f"{k} = {v}" for k, v in asdict(a).items()) + ".", "",
             f"| policy | GPU-hours per update (±{100 * error_band:.0f}%) | vs sync | s per update | GS | WS | "
             "S p90 | S max | rejected |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.policy} | {r.gpu_hours_per_update:.3f} [{r.gpu_hours_low:.3f}, {r.gpu_hours_high:.3f}] | "
                     f"{r.relative_to_sync:.2f} | {r.seconds_per_update:.1f} | {r.gs_mean:.2f} | {r.ws_mean:.2f} | "
                     f"{r.s_p90:.2f} | {r.s_max:.2f} | {100 * r.rejection_rate:.1f}% |")
    return "\n".join(lines)


def plot_staleness(raw: dict[str, list[SimResult]], path: Path) -> Path:
    """Histograms of S = GS + WS of the consumed trajectories per asynchronous policy, pooled over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = [p for p in raw if p != "sync"]
    fig, axes = plt.subplots(1, len(policies), figsize=(3.2 * len(policies), 2.8), sharey=True)
    for ax, p in zip(np.atleast_1d(axes), policies, strict=True):
        s = np.concatenate([r.s for r in raw[p]])
        ax.hist(s, bins=np.arange(0, max(8.0, float(s.max()) + 0.5), 0.5), density=True)
        ax.set_title(p)
        ax.set_xlabel("S = GS + WS (versions)")
    np.atleast_1d(axes)[0].set_ylabel("density of consumed trajectories (per version)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class ScaleArgs:
    """``python -m agentenv.trainer.experiments.simulated_scale``."""

    cluster: ClusterAssumptions = ClusterAssumptions()
    seeds: int = 3
    """Simulator seeds per policy."""
    error_band: float = 0.2
    """Relative error of the simulated time per update, from the calibration on real runs."""
    out: Path | None = None
    """Folder for ``scale.md``, ``scale.json`` and ``staleness.png``."""


def main(argv: list[str] | None = None) -> int:
    """Simulate the cluster, print the table, write ``--out``; 0 on success, 2 on a bad value."""
    import tyro

    try:
        args = tyro.cli(ScaleArgs, args=argv, prog="simulated_scale",
                        description="GPU-hours, staleness and rejections per policy at a simulated cluster scale.")
        rows, raw = simulate_scale(args.cluster, args.seeds, args.error_band)
    except ConfigError as e:
        print(f"simulated_scale: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    table = format_scale(rows, args.cluster, args.error_band)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scale.md").write_text(table + "\n")
        (args.out / "scale.json").write_text(json.dumps(
            {"assumptions": asdict(args.cluster), "seeds": args.seeds, "error_band": args.error_band,
             "policies": [asdict(r) for r in rows]}, indent=2) + "\n")
        plot_staleness(raw, args.out / "staleness.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

