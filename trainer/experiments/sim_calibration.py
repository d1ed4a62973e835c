"""The pipeline simulator calibrated on real runs: ``agentenv simulate --from-run RUN...``.

A training run's folder holds what the simulator needs to replay it: the config (B, concurrency,
back-pressure, the staleness policy and its settings, the tool latency), every consumed trajectory's
lengths, versions and start and completion times (``staleness.jsonl``), every selection's rejections
(``decisions.jsonl``) and the busy seconds of engine and learner (``metrics.jsonl``).

What is read off the runs and what is fitted:

- **Read per run**: the episode lengths (policy tokens per turn of the consumed trajectories, drawn
  with replacement: :class:`~agentenv.trainer.experiments.simulator.EpisodeSample`; split evenly over
  the turns for a run whose records lack ``turn_policy_tokens``), the share of
  batches without a step, the loop's seconds per step outside the batch wait and the learner (the
  sampling check, the logs), the tool latency (``env.step_latency``: lognormal, mean = median x
  exp(sigma^2 / 2)) and the pool's settings.
- **Read from the fitting runs**: the learner's seconds per step alone, from a synchronous run
  (nothing decodes while it trains), split into the optimizer step and what follows it (the weights'
  copy into the engine, the probe), during which the learner's version has moved on and the engine
  still samples the old weights.
- **Fitted, four numbers**: the decode speed (one scale ``k`` on a fixed step-time shape ``a + b n``,
  so that the synchronous run's mean episode duration comes out right), the two slowdowns of shared
  compute (``train_slows_decode`` and ``decode_slows_train``, so that an asynchronous run's mean episode
  duration and learner seconds per step come out right) and how much of the learner's time after a
  step the engine still samples the old weights (so that the asynchronous run's mean generation
  staleness comes out right). Bisection on the simulator itself.

Every other run is then a prediction: updates per hour, mean generation and waiting staleness (GS, WS)
and the rejection rate, each against what the run measured. The step-time shape defaults to the
2-core VM's decode of SmolLM2-135M (BENCHMARKS.md, "Engine decode": 112, 169 and 215 ms per step with
1, 8 and 16 rows, least squares ``0.108 + 0.0068 n`` seconds).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentenv.errors import ConfigError
from agentenv.trainer.experiments.sim_result import SimResult
from agentenv.trainer.experiments.simulator import EpisodeSample, SimConfig, simulate

DECODE_SHAPE_S: tuple[float, float] = (0.108, 0.0068)
"""Default decode step-time shape ``(a, b)``, seconds: a step decoding ``n`` sequences takes ``a + b n``."""

FIGURES: tuple[str, ...] = ("updates_per_hour", "gs_mean", "ws_mean", "rejection_rate", "episode_s_mean")
"""What a run measured and the simulator predicts, in table order."""
FIGURE_TITLES: dict[str, str] = {"updates_per_hour": "updates/h", "gs_mean": "GS", "ws_mean": "WS",
                                 "rejection_rate": "rejected %", "episode_s_mean": "episode s"}


@dataclass(frozen=True)
class RunMeasurement:
    """What one training run's folder says about its pipeline (times in seconds, staleness in versions).

    Attributes:
        name: The folder's name.
        mode: ``"sync"`` or ``"async"``.
        policy: The simulator's policy name (``sync``, ``none``, ``max_lag``, ``pace`` for scoring
            drift, ``pace_share`` for token-share drift).
        batch_size, concurrency, max_pool_size: The run's B, episodes in flight and back-pressure.
        max_lag, gamma, beta: The staleness policy's settings.
        target_occupancy: PACE's target occupancy (None: B).
        tool_latency_mean_s, tool_latency_sigma: The environment's added step latency (lognormal mean
            and shape; 0 when the run had none).
        prompt_tokens: Median environment tokens per consumed trajectory (prompt and observations).
        episodes: The consumed trajectories' policy tokens and turns.
        batches: Batches consumed (rows of ``metrics.jsonl``).
        steps: Optimizer steps taken (the last row's policy version).
        wall_s: Seconds from the start of the update loop to the last row.
        learner_s: Seconds the learner was busy (steps, weight copies into the engine).
        step_s: Seconds of the optimizer steps themselves (``learner/update_seconds``, summed); the rest
            of ``learner_s`` is the weights' copy and sync into the engine and the probe after them.
        overhead_s: Seconds of the update loop neither waiting for a batch nor in the learner (the
            sampling check and the logs after each step).
        gs_mean, ws_mean: Mean generation and waiting staleness of the consumed trajectories.
        rejected: Trajectories the staleness policy rejected.
        consumed: Trajectories consumed.
        episode_s_mean: Mean seconds from an episode's start to its completion (consumed ones).
    """

    name: str
    mode: str
    policy: str
    batch_size: int
    concurrency: int
    max_pool_size: int
    max_lag: float
    gamma: float
    beta: float
    target_occupancy: int | None
    tool_latency_mean_s: float
    tool_latency_sigma: float
    prompt_tokens: int
    episodes: EpisodeSample
    batches: int
    steps: int
    wall_s: float
    learner_s: float
    step_s: float
    overhead_s: float
    gs_mean: float
    ws_mean: float
    rejected: int
    consumed: int
    episode_s_mean: float

    @property
    def updates_per_hour(self) -> float:
        """Optimizer steps per hour of the update loop."""
        return self.steps / self.wall_s * 3600.0

    @property
    def rejection_rate(self) -> float:
        """Rejected / (rejected + consumed)."""
        return self.rejected / (self.rejected + self.consumed)

    @property
    def learner_s_per_step(self) -> float:
        """The learner's busy seconds per optimizer step."""
        return self.learner_s / max(self.steps, 1)

    @property
    def step_overhead_s(self) -> float:
        """Seconds of the update loop per step outside the batch wait and the learner."""
        return max(0.0, self.overhead_s) / max(self.steps, 1)

    @property
    def no_step_share(self) -> float:
        """Share of batches that took no step (every reward equal)."""
        return (self.batches - self.steps) / self.batches

    def figures(self) -> dict[str, float]:
        """The measured :data:`FIGURES`."""
        return {name: float(getattr(self, name)) for name in FIGURES}


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _episodes(consumed: list[dict[str, Any]]) -> EpisodeSample:
    """The consumed trajectories' lengths per turn.

    Split as measured where every record has ``turn_policy_tokens`` (policy tokens per reply), else
    evenly over each trajectory's turns.
    """
    split = [r.get("turn_policy_tokens") for r in consumed]
    if all(split):
        return EpisodeSample(np.array([sum(t) for t in split]), np.array([len(t) for t in split]),
                             tuple(tuple(int(n) for n in t) for t in split))
    return EpisodeSample(np.array([max(1, r["policy_tokens"]) for r in consumed]),
                         np.array([max(1, r["turns"] or 1) for r in consumed]))


def measure_run(run_dir: str | Path) -> RunMeasurement:
    """Read a training run's folder into a :class:`RunMeasurement`.

    Raises:
        ConfigError: The folder lacks ``config.yaml``, ``metrics.jsonl``, ``staleness.jsonl`` or
            ``decisions.jsonl``, logged no update, or its ``staleness.jsonl`` has no start and
            completion times (written by older versions of the trainer).
    """
    run_dir = Path(run_dir)
    files = {n: run_dir / n for n in ("config.yaml", "metrics.jsonl", "staleness.jsonl", "decisions.jsonl")}
    missing = [n for n, p in files.items() if not p.is_file()]
    if missing:
        raise ConfigError(f"{run_dir} is not a training run folder with logged updates: missing {', '.join(missing)}")
    cfg = yaml.safe_load(files["config.yaml"].read_text())
    rows, consumed = _jsonl(files["metrics.jsonl"]), _jsonl(files["staleness.jsonl"])
    if not rows or not consumed:
        raise ConfigError(f"{run_dir} logged no update")
    if "start_time" not in consumed[0]:
        raise ConfigError(f"{run_dir}/staleness.jsonl has no start and completion times: the run is older than "
                          "the simulator's calibration; train it again to replay it")
    run, stale, latency = cfg["run"], cfg["staleness"], cfg["env"].get("step_latency") or {}
    # a sync run: staleness.policy sync (or run.mode: sync, in run folders whose config still has that key)
    mode = "sync" if stale["policy"] == "sync" or run.get("mode") == "sync" else "async"
    policy = "sync" if mode == "sync" else stale["policy"]
    if policy == "pace" and stale.get("drift_mode") == "token_share":
        policy = "pace_share"
    median, sigma = float(latency.get("median_s", 0.0)), float(latency.get("sigma", 0.0))
    last, waited = rows[-1], sum(float(r["time/wait_s"]) for r in rows)
    decisions = _jsonl(files["decisions.jsonl"])
    return RunMeasurement(
        name=run_dir.name, mode=mode, policy=policy, batch_size=int(run["batch_size"]),
        concurrency=int(run["concurrency"]), max_pool_size=int(run["max_pool_size"]),
        max_lag=float(stale["max_lag"]), gamma=float(stale["gamma"]), beta=float(stale["beta"]),
        target_occupancy=stale.get("target_occupancy"),
        tool_latency_mean_s=median * math.exp(sigma**2 / 2), tool_latency_sigma=sigma,
        prompt_tokens=max(1, int(statistics.median(r["tokens"] - r["policy_tokens"] for r in consumed))),
        episodes=_episodes(consumed),
        batches=len(rows), steps=int(last["learner/version"]), wall_s=float(last["busy/wall_s"]),
        learner_s=float(last["busy/learner_s"]),
        step_s=sum(float(r.get("learner/update_seconds") or 0.0) for r in rows),
        overhead_s=float(last["busy/wall_s"]) - waited - float(last["busy/learner_s"]),
        gs_mean=float(np.mean([r["gs"] for r in consumed])), ws_mean=float(np.mean([r["ws"] for r in consumed])),
        rejected=sum(int(d["rejected_count"]) for d in decisions), consumed=len(consumed),
        episode_s_mean=float(np.mean([r["completion_time"] - r["start_time"] for r in consumed])),
    )


@dataclass(frozen=True)
class Calibration:
    """The three fitted numbers and the learner's time alone (seconds).

    Attributes:
        decode_base_s, decode_per_seq_s: The decode step time ``a + b n`` (the shape times the fitted scale).
        train_step_s: The learner's seconds per step alone (the synchronous fitting run's).
        weight_copy_s: The part of the learner's seconds after each step (the synchronous fitting run's
            copy and sync of the weights into the engine, and the probe after them) during which the
            engine still samples the old weights; fitted, since the probe runs after the sync. With
            ``train_step_s`` it makes the learner's measured seconds per step.
        train_slows_decode, decode_slows_train: The shared-compute slowdowns (>= 1).
        fitted_on: Names of the runs the numbers came from.
    """

    decode_base_s: float
    decode_per_seq_s: float
    train_step_s: float
    weight_copy_s: float
    train_slows_decode: float
    decode_slows_train: float
    fitted_on: tuple[str, ...]


def sim_config(m: RunMeasurement, cal: Calibration, seed: int = 0) -> SimConfig:
    """The simulator's settings that replay run ``m`` under calibration ``cal``, stopping at its batch count."""
    return SimConfig(
        policy=m.policy, batch_size=m.batch_size, concurrency=m.concurrency, num_trajectories=10**9,
        max_batches=m.batches, seed=seed, turns_mean=max(1.0, float(np.mean(m.episodes.turns))),
        tool_latency_mean_s=m.tool_latency_mean_s, tool_latency_sigma=m.tool_latency_sigma,
        prompt_tokens=m.prompt_tokens, obs_tokens=0, decode_base_s=cal.decode_base_s,
        decode_per_seq_s=cal.decode_per_seq_s, train_step_s=cal.train_step_s, weight_sync_s=0.0,
        weight_copy_s=cal.weight_copy_s,
        step_overhead_s=m.step_overhead_s,
        max_pool_size=m.max_pool_size, no_step_share=m.no_step_share,
        train_slows_decode=cal.train_slows_decode, decode_slows_train=cal.decode_slows_train,
        max_lag=m.max_lag, gamma=m.gamma, beta=m.beta, target_occupancy=m.target_occupancy,
    )


def replay(m: RunMeasurement, cal: Calibration, seeds: int) -> list[SimResult]:
    """Simulate run ``m`` once per seed ``0 .. seeds - 1``."""
    return [simulate(sim_config(m, cal, seed), episodes=m.episodes) for seed in range(seeds)]


def _mean(results: list[SimResult], figure: str) -> float:
    if figure == "learner_s_per_step":
        return float(np.mean([r.trainer_busy * r.sim_time_s / max(r.updates, 1) for r in results]))
    return float(np.mean([r.summary()[figure] for r in results]))


def _bisect(f: Any, target: float, lo: float, hi: float, increasing: bool, rel_tol: float = 0.005,
            linear: bool = False) -> float:
    """``x`` in ``[lo, hi]`` with ``f(x)`` nearest ``target`` for monotone ``f``, to ``rel_tol`` of ``hi``.

    Geometric bisection (the values span orders of magnitude; ``lo > 0``), or arithmetic with
    ``linear``; a target outside ``f``'s range on the interval gives the nearer bound.
    """
    def mid_of(a: float, b: float) -> float:
        return (a + b) / 2 if linear else math.sqrt(a * b)

    while (hi - lo > rel_tol * hi) if linear else (hi / lo > 1.0 + rel_tol):
        mid = mid_of(lo, hi)
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return mid_of(lo, hi)


def calibrate(sync_run: RunMeasurement, async_run: RunMeasurement, seeds: int = 8,
              shape: tuple[float, float] = DECODE_SHAPE_S, rounds: int = 2) -> Calibration:
    """Fit the decode speed on a synchronous run and shared compute's slowdowns on an asynchronous one.

    Args:
        sync_run: A synchronous run: its learner seconds per step are the learner's time alone, and
            the decode scale is fitted to its mean episode duration.
        async_run: An asynchronous run: the two slowdowns and the window of old weights are fitted, in
            ``rounds`` alternating rounds, to its learner seconds per step, its mean episode duration
            and its mean generation staleness.
        seeds: Simulator seeds averaged per evaluation of a candidate.
        shape: The decode step-time shape ``(a, b)`` in seconds; only its ratio matters.
        rounds: Alternating rounds of the two slowdowns' fits (each changes what the other sees).

    Raises:
        ConfigError: ``sync_run`` is not synchronous or ``async_run`` is.
    """
    if sync_run.mode != "sync" or async_run.mode == "sync":
        raise ConfigError("calibrate() needs one synchronous run and one asynchronous run")
    a, b = shape
    # The learner's seconds per step alone, and the part of them that is the optimizer step itself;
    # the rest (copy, sync, probe) holds the window of old weights, fitted below.
    step_s = sync_run.step_s / max(sync_run.steps, 1) if sync_run.step_s > 0 else sync_run.learner_s_per_step
    after_step = max(sync_run.learner_s_per_step, step_s)
    cal = Calibration(a, b, after_step, 0.0, 1.0, 1.0, (sync_run.name, async_run.name))

    def scaled(k: float) -> Calibration:
        return replace(cal, decode_base_s=a * k, decode_per_seq_s=b * k)

    k = _bisect(lambda k: _mean(replay(sync_run, scaled(k), seeds), "episode_s_mean"), sync_run.episode_s_mean,
                1e-4, 1e2, increasing=True)
    cal = scaled(k)

    def window(w: float) -> Calibration:
        return replace(cal, train_step_s=after_step - w, weight_copy_s=w)

    for _ in range(rounds):
        cal = replace(cal, decode_slows_train=_fit_slowdown(async_run, cal, "decode_slows_train", seeds))
        cal = replace(cal, train_slows_decode=_fit_slowdown(async_run, cal, "train_slows_decode", seeds))
        w = _bisect(lambda w: _mean(replay(async_run, window(w), seeds), "gs_mean"), async_run.gs_mean,
                    0.0, after_step - step_s, increasing=True, linear=True) if after_step > step_s else 0.0
        cal = window(w)
    return cal


def _fit_slowdown(run: RunMeasurement, cal: Calibration, name: str, seeds: int) -> float:
    """The slowdown ``name`` in [1, 10] that makes the replayed ``run`` match what it measured.

    ``decode_slows_train`` is fitted to the learner's seconds per step, ``train_slows_decode`` to the
    mean episode duration.
    """
    figure, target = (("learner_s_per_step", run.learner_s_per_step) if name == "decode_slows_train"
                      else ("episode_s_mean", run.episode_s_mean))
    return _bisect(lambda c: _mean(replay(run, replace(cal, **{name: c}), seeds), figure), target, 1.0, 10.0,
                   increasing=True)


@dataclass(frozen=True)
class Comparison:
    """One run's measured figures against the simulator's (mean and sd over seeds)."""

    run: str
    policy: str
    fitted: bool
    measured: dict[str, float]
    simulated: dict[str, float]
    simulated_sd: dict[str, float]

    def relative_error(self, figure: str) -> float | None:
        """(simulated - measured) / measured; None where the measured figure is 0."""
        m = self.measured[figure]
        return (self.simulated[figure] - m) / m if m else None


def compare_runs(runs: list[RunMeasurement], cal: Calibration, seeds: int = 20) -> list[Comparison]:
    """Every run replayed under ``cal`` (``seeds`` simulator seeds each), against what it measured."""
    out = []
    for m in runs:
        results = replay(m, cal, seeds)
        per = {f: [r.summary()[f] for r in results] for f in FIGURES}
        out.append(Comparison(m.name, m.policy, m.name in cal.fitted_on, m.figures(),
                              {f: float(np.mean(v)) for f, v in per.items()},
                              {f: float(np.std(v, ddof=1)) if len(v) > 1 else 0.0 for f, v in per.items()}))
    return out


def format_comparison(rows: list[Comparison]) -> str:
    """A Markdown table: per run and figure, measured, simulated (mean +- sd over seeds) and the error.

    The error is relative for updates per hour and episode seconds; for GS and WS (often near 0) it is
    also given in versions, for the rejection rate in points.
    """
    head = ["run", "policy", "role"] + [FIGURE_TITLES[f] + " measured / simulated (error)" for f in FIGURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in rows:
        cells = [c.run, c.policy, "fit" if c.fitted else "predicted"]
        for f in FIGURES:
            scale = 100.0 if f == "rejection_rate" else 1.0
            m, s, sd = (scale * v[f] for v in (c.measured, c.simulated, c.simulated_sd))
            e = c.relative_error(f)
            errs = [f"{100 * e:+.0f}%"] if e is not None else []
            if f in ("gs_mean", "ws_mean", "rejection_rate"):
                errs.append(f"{s - m:+.2f}")
            cells.append(f"{m:.2f} / {s:.2f} ± {sd:.2f} ({', '.join(errs)})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class FromRunArgs:
    """``agentenv simulate --from-run RUN...``: replay real runs and compare."""

    from_run: tuple[Path, ...]
    """Training run folders to replay (with ``staleness.jsonl`` start and completion times)."""
    fit: tuple[str, ...] = ()
    """Names of the two folders to fit on (one synchronous, one asynchronous); default: the first of each."""
    seeds: int = 20
    """Simulator seeds per replayed run (8 per candidate while fitting)."""
    decode_shape: tuple[float, float] = DECODE_SHAPE_S
    """Decode step-time shape ``(a, b)``, seconds: a step decoding ``n`` sequences takes ``a + b n``."""
    out: Path | None = None
    """Folder for ``calibration.json`` (fitted numbers, measured and simulated figures) and ``comparison.md``."""


def run_from_args(args: FromRunArgs) -> str:
    """Measure, fit, replay and compare; write ``args.out`` when given; return the Markdown table.

    Raises:
        ConfigError: A folder cannot be read, ``--fit`` names an unknown run, or there is not one
            synchronous and one asynchronous run to fit on.
    """
    runs = [measure_run(p) for p in args.from_run]
    by_name = {m.name: m for m in runs}
    if args.fit:
        unknown = [n for n in args.fit if n not in by_name]
        if unknown:
            raise ConfigError(f"--fit names runs not given with --from-run: {unknown}")
        chosen = [by_name[n] for n in args.fit]
    else:
        chosen = runs
    sync = next((m for m in chosen if m.mode == "sync"), None)
    asyn = next((m for m in chosen if m.mode != "sync"), None)
    if sync is None or asyn is None:
        raise ConfigError("fitting needs one synchronous and one asynchronous run among --from-run (or --fit)")
    cal = calibrate(sync, asyn, shape=args.decode_shape)
    rows = compare_runs(runs, cal, seeds=args.seeds)
    table = format_comparison(rows)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "calibration.json").write_text(json.dumps({
            "calibration": asdict(cal), "seeds": args.seeds, "decode_shape": list(args.decode_shape),
            "runs": [{**asdict(c), "learner_s_per_step": by_name[c.run].learner_s_per_step,
                      "no_step_share": by_name[c.run].no_step_share, "batches": by_name[c.run].batches}
                     for c in rows],
        }, indent=2) + "\n")
        (args.out / "comparison.md").write_text(table + "\n")
    return table


def main(argv: list[str]) -> int:
    """The ``--from-run`` form of ``agentenv simulate``; 0 on success, 2 on a bad argument or folder."""
    from agentenv.cli_args import parse

    args = parse(FromRunArgs, argv, prog="agentenv simulate", conventions=False,
                 description="Replay real training runs in the simulator, calibrated on two of them.")
    if isinstance(args, int):
        return args
    try:
        table = run_from_args(args)
    except ConfigError as e:
        print(f"agentenv simulate: {e}", file=sys.stderr)
        return 2
    print(table)
    return 0
