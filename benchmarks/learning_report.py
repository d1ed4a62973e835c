"""Figures of learning runs: held-out change with 95% intervals, pace, gradient share, gate admission.

Reads finished run folders of ``agentenv train`` (``summary.json``, ``metrics.jsonl``,
``eval_before.json``, ``eval_after.json``) and prints one row per run plus their mean, as Markdown:

    .venv/bin/python benchmarks/learning_report.py runs/learn_seed0 runs/learn_seed1

Figures per run: held-out success before and after (with the paired-bootstrap and two-proportion
95% intervals of the change), updates (optimizer steps) and batches consumed, updates per hour of
the update loop, seconds from the start to the first update, the share of batches that carried
gradient (rewards not all equal and some row admitted), the trust gate's admission rate over all
rows, and the run's wall-clock time and peak memory. The baseline of each figure is the same run's
"before" evaluation: the change is measured against the policy the updates started from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agentenv.trainer.significance import paired_bootstrap, two_proportion_interval


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_figures(run: Path) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    rows = read_jsonl(run / "metrics.jsonl")
    before = json.loads((run / "eval_before.json").read_text())
    after_path = run / "eval_after.json"  # absent when the run was stopped before its last update
    after = json.loads(after_path.read_text()) if after_path.is_file() else None
    nan = float("nan")
    if after is not None:
        paired = paired_bootstrap(before["outcomes"], after["outcomes"])
        unpaired = two_proportion_interval(before["outcomes"], after["outcomes"])
        delta, p_ci, u_ci = paired.delta, (paired.low, paired.high), (unpaired.low, unpaired.high)
    else:
        delta, p_ci, u_ci = nan, (nan, nan), (nan, nan)
    stepped = [r for r in rows if r.get("learner/stepped")]
    first_update = next((r["time/elapsed_s"] for r in rows if r.get("learner/stepped")), float("nan"))
    admitted = sum(r["learner/admitted_fraction"] * r["learner/rows"] for r in rows)
    total_rows = sum(r["learner/rows"] for r in rows)
    return {
        "run": run.name,
        "before": before["success_rate"],
        "after": after["success_rate"] if after else nan,
        "tasks": before["tasks"],
        "delta": delta,
        "paired": p_ci,
        "unpaired": u_ci,
        "updates": summary["updates"],
        "batches": len(rows),
        "updates_per_hour": summary["updates"] / summary["train_s"] * 3600,
        "first_update_s": first_update,
        "gradient_share": len(stepped) / len(rows) if rows else float("nan"),
        "admission": admitted / total_rows if total_rows else float("nan"),
        "wall_min": summary["wall_clock_s"] / 60,
        "train_min": summary["train_s"] / 60,
        "peak_gb": summary["peak_rss_gb"],
        "reward_first10": sum(r["reward/mean"] for r in rows[:10]) / max(len(rows[:10]), 1),
        "reward_last10": sum(r["reward/mean"] for r in rows[-10:]) / max(len(rows[-10:]), 1),
        "stopped": bool(summary.get("interrupted")),
    }


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    figs = [run_figures(Path(a)) for a in argv]
    print("| run | held-out before | after | change | 95% CI paired | 95% CI two-prop. | updates (batches) "
          "| updates/h | first update | batches with gradient | gate admitted | reward first 10 / last 10 "
          "| update loop | whole run | peak RSS |")
    print("|---|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for f in figs:
        print(f"| {f['run']} | {f['before']:.3f} | {f['after']:.3f} | {100 * f['delta']:+.1f} pts "
              f"| [{100 * f['paired'][0]:+.1f}, {100 * f['paired'][1]:+.1f}] "
              f"| [{100 * f['unpaired'][0]:+.1f}, {100 * f['unpaired'][1]:+.1f}] "
              f"| {f['updates']} ({f['batches']}) | {f['updates_per_hour']:.0f} | {f['first_update_s']:.0f} s "
              f"| {100 * f['gradient_share']:.0f}% | {100 * f['admission']:.0f}% "
              f"| {f['reward_first10']:.3f} / {f['reward_last10']:.3f} | {f['train_min']:.1f} min "
              f"| {f['wall_min']:.1f} min{' (stopped)' if f['stopped'] else ''} | {f['peak_gb']:.1f} GB |")
    if len(figs) > 1:
        mean = sum(f["delta"] for f in figs) / len(figs)
        print(f"\nmean change over {len(figs)} runs: {100 * mean:+.1f} points "
              f"(each run's own {figs[0]['tasks']} held-out tasks, paired before/after)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
