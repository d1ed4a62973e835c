"""Learning across seeds: held-out change per run, its spread over seeds, and whether any run collapsed.

Reads finished ``agentenv train`` run folders (``metrics.jsonl``, ``eval_before.json``,
``eval_after.json``, ``summary.json``) of the same config and different ``run.seed``:

    python -m agentenv.trainer.experiments.learning_report RUN [RUN ...] [--out DIR]

prints a Markdown table (one row per run, then mean, sd, min and max over runs) and, with
``--out``, writes ``report.json`` and ``curves.png`` (reward per batch and entropy per update, every
run overlaid) there.

Per run: held-out success before and after, the paired 95% interval of the change (bootstrap over
tasks, :func:`agentenv.trainer.experiments.significance.paired_bootstrap`), and two collapse checks on the
per-update logs:

* **reward holds**: the mean batch reward over the last quarter of the run's batches is at least the
  mean over the second quarter (quarters of ``ceil(n / 4)`` batches; the last quarter is the last
  ``ceil(n / 4)``). Every batch counts, also one that took no step because all its rewards were equal:
  leaving those out would drop the all-correct batches of a run's end and the all-wrong ones of its
  start, a bias against the check that grows as the batch shrinks;
* **entropy bounded**: from update 3 on, the policy's entropy on the batch never exceeds 3 x its
  running minimum (the minimum over updates 1..u); the largest such ratio is reported. The entropy
  read is the first of :data:`ENTROPY_KEYS` the run logs: ``probe/policy_entropy`` (the exact
  entropy of pi_theta on a fixed probe of rows, the same states after every update,
  ``run.entropy_probe``), ``learner/policy_entropy`` (the exact entropy at the batch's policy
  tokens, from the update's forward pass: it moves with the batch's success, since successful
  replies are confident), ``learner/behaviour_entropy`` (the mean ``-log mu`` of the sampled
  tokens, a one-sample estimate of the latter whose noise per batch is larger);
  :attr:`RunReport.entropy_key` says which.

Across runs: mean, sample standard deviation, min and max of "after", and a 95% interval of the
mean change that resamples seeds, then tasks (:func:`agentenv.trainer.experiments.significance.seed_task_bootstrap`).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from agentenv.errors import DataError
from agentenv.trainer.experiments.significance import paired_bootstrap, seed_task_bootstrap

__all__ = ["RunReport", "aggregate", "entropy_ratio", "main", "read_run", "reward_holds"]

#: Largest allowed ratio of the entropy to its running minimum (from update 3 on).
ENTROPY_RATIO_LIMIT = 3.0

#: The entropy figures the collapse check reads, the first one a run logs (see the module docstring).
ENTROPY_KEYS = ("probe/policy_entropy", "learner/policy_entropy", "learner/behaviour_entropy")


@dataclass(frozen=True)
class RunReport:
    """One run's figures (success rates are fractions; entropies nats per token)."""

    run: str
    seed: int | None
    updates: int
    before: float
    after: float
    delta: float
    low: float
    high: float
    rewards: list[float]  # per batch, stepped or not
    entropies: list[float]  # per update
    entropy_key: str
    reward_holds: bool
    entropy_ratio: float
    before_outcomes: list[float]
    after_outcomes: list[float]
    peak_rss_gb: float | None
    wall_clock_min: float | None

    @property
    def collapsed(self) -> bool:
        """Either collapse check failed."""
        return not self.reward_holds or self.entropy_ratio > ENTROPY_RATIO_LIMIT


def reward_holds(rewards: Sequence[float]) -> bool:
    """Mean of the last quarter of ``rewards`` >= mean of the second quarter (see the module docstring).

    Raises:
        DataError: Fewer than 4 batches (no quarters to compare).
    """
    n = len(rewards)
    if n < 4:
        raise DataError(f"the collapse check needs at least 4 batches, got {n}")
    q = math.ceil(n / 4)
    return statistics.fmean(rewards[-q:]) >= statistics.fmean(rewards[q : 2 * q])


def entropy_ratio(entropies: Sequence[float]) -> float:
    """``max over u >= 3 of H_u / min(H_1..H_u)`` (1.0 with fewer than 3 updates; NaNs skipped)."""
    worst, low = 1.0, math.inf
    for u, h in enumerate(entropies, start=1):
        if not math.isfinite(h):
            continue
        low = min(low, h)
        if u >= 3 and low > 0:
            worst = max(worst, h / low)
    return worst


def read_run(run: Path | str) -> RunReport:
    """The :class:`RunReport` of a finished run folder.

    Raises:
        DataError: A file is missing (the message names it) or the run has no "after" evaluation.
    """
    run = Path(run)
    paths = {k: run / f for k, f in (("metrics", "metrics.jsonl"), ("before", "eval_before.json"),
                                      ("after", "eval_after.json"))}
    for what, path in paths.items():
        if not path.is_file():
            raise DataError(f"{run}: no {path.name} (a {what} record); is it a finished training run?")
    batches = [json.loads(line) for line in paths["metrics"].read_text().splitlines() if line.strip()]
    batches = [r for r in batches if "reward/mean" in r]
    rows = [r for r in batches if r.get("learner/stepped", 1)]  # batches without a step are not updates
    before = json.loads(paths["before"].read_text())
    after = json.loads(paths["after"].read_text())
    interval = paired_bootstrap(before["outcomes"], after["outcomes"])
    rewards = [float(r["reward/mean"]) for r in batches]
    # the fixed probe where the run logs it, else the batch's exact entropy, else the one-sample -log mu
    key = next((k for k in ENTROPY_KEYS if any(r.get(k) is not None for r in rows)), ENTROPY_KEYS[-1])
    entropies = [math.nan if r.get(key) is None else float(r[key]) for r in rows]  # NaN is written as null
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    seed = None
    config = run / "config.yaml"
    if config.is_file():
        import yaml

        seed = (yaml.safe_load(config.read_text()) or {}).get("run", {}).get("seed")
    return RunReport(
        run=run.name, seed=seed, updates=len(rows), before=interval.before, after=interval.after,
        delta=interval.delta, low=interval.low, high=interval.high, rewards=rewards, entropies=entropies,
        entropy_key=key,
        reward_holds=reward_holds(rewards) if len(rewards) >= 4 else False, entropy_ratio=entropy_ratio(entropies),
        before_outcomes=list(before["outcomes"]), after_outcomes=list(after["outcomes"]),
        peak_rss_gb=summary.get("peak_rss_gb"),
        wall_clock_min=summary["wall_clock_s"] / 60 if "wall_clock_s" in summary else None,
    )


def aggregate(reports: Sequence[RunReport]) -> dict[str, Any]:
    """Mean, sample sd, min and max of "after" and of the change over runs, and the seeds-then-tasks interval.

    Raises:
        DataError: No runs, or runs evaluated on different numbers of held-out tasks.
    """
    if not reports:
        raise DataError("no runs to aggregate")
    after = [r.after for r in reports]
    delta = [r.delta for r in reports]
    sd = statistics.stdev if len(reports) > 1 else (lambda _: math.nan)
    mean_change = seed_task_bootstrap([r.before_outcomes for r in reports], [r.after_outcomes for r in reports])
    return {
        "runs": len(reports),
        "after_mean": statistics.fmean(after), "after_sd": sd(after), "after_min": min(after),
        "after_max": max(after),
        "change_mean": statistics.fmean(delta), "change_sd": sd(delta), "change_min": min(delta),
        "change_low": mean_change.low, "change_high": mean_change.high,
        "every_run_gains": all(r.low > 0 for r in reports),
        "collapsed_runs": [r.run for r in reports if r.collapsed],
    }


def plot_curves(reports: Sequence[RunReport], path: Path) -> Path:
    """Reward per batch and entropy (:attr:`RunReport.entropy_key`) per update, every run overlaid, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6))
    for r in reports:
        label = r.run if r.seed is None else f"seed {r.seed}"
        top.plot(range(1, len(r.rewards) + 1), r.rewards, marker="o", ms=3, label=label)
        bottom.plot(range(1, r.updates + 1), r.entropies, marker="o", ms=3, label=label)
    top.set_ylabel("batch reward (mean)")
    top.set_xlabel("batch (with or without a step)")
    top.set_ylim(-0.02, 1.02)
    top.legend(fontsize=8, ncol=2)
    keys = sorted({r.entropy_key.replace("_", " ") for r in reports})
    bottom.set_ylabel(f"{' / '.join(keys)} (nats/token)")
    bottom.set_yscale("log")
    bottom.set_xlabel("update (policy version)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown(reports: Sequence[RunReport], agg: dict[str, Any]) -> str:
    """The report as a Markdown table (percentages in points)."""
    lines = ["| run | seed | updates | before | after | change [95% CI, paired] | reward holds | entropy max/min "
             "| peak RSS | whole run |", "|---|---:|---:|---:|---:|---|---|---:|---:|---:|"]
    for r in reports:
        rss = f"{r.peak_rss_gb:.1f} GB" if r.peak_rss_gb is not None else "-"
        wall = f"{r.wall_clock_min:.1f} min" if r.wall_clock_min is not None else "-"
        lines.append(f"| {r.run} | {r.seed} | {r.updates} | {r.before:.3f} | {r.after:.3f} "
                     f"| {100 * r.delta:+.1f} [{100 * r.low:+.1f}, {100 * r.high:+.1f}] "
                     f"| {'yes' if r.reward_holds else 'no'} | {r.entropy_ratio:.2f} | {rss} | {wall} |")
    lines.append("")
    lines.append(f"after over {agg['runs']} runs: mean {agg['after_mean']:.3f}, sd {agg['after_sd']:.3f}, "
                 f"min {agg['after_min']:.3f}, max {agg['after_max']:.3f}; change mean "
                 f"{100 * agg['change_mean']:+.1f} points [{100 * agg['change_low']:+.1f}, "
                 f"{100 * agg['change_high']:+.1f}] (95%, seeds then tasks resampled), min "
                 f"{100 * agg['change_min']:+.1f}; collapsed: {', '.join(agg['collapsed_runs']) or 'none'}")
    return "\n".join(lines)


@dataclass(frozen=True)
class ReportArgs:
    """The learning report's options.

    Attributes:
        runs: Finished training run folders.
        out: Folder for report.json and curves.png (default: print the report only).
    """

    runs: Annotated[tuple[Path, ...], tyro.conf.Positional, tyro.conf.arg(metavar="RUN...")]
    out: Path | None = None


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: print the Markdown report; ``--out DIR`` also writes report.json and curves.png."""
    from agentenv.cli_args import parse

    args = parse(ReportArgs, sys.argv[1:] if argv is None else argv, prog="learning_report",
                 description=__doc__.split("\n\n")[0])
    if isinstance(args, int):
        return args
    try:
        reports = [read_run(r) for r in args.runs]
        agg = aggregate(reports)
    except DataError as exc:
        print(f"learning_report: {exc}", file=sys.stderr)
        return 2
    print(markdown(reports, agg))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        runs = [{k: v for k, v in asdict(r).items() if not k.endswith("_outcomes")} for r in reports]
        (args.out / "report.json").write_text(json.dumps({"runs": runs, "aggregate": agg}, indent=1) + "\n")
        plot_curves(reports, args.out / "curves.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
