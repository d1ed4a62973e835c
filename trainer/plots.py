"""PNG plots of a run, drawn from its JSONL logs after (or during) training.

Four figures: reward per update, the generation- and waiting-staleness histograms of consumed
trajectories, and pool occupancy with rejections per update. Matplotlib's Agg backend is used, so
no display is needed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a missing file or a torn last line (a run killed mid-write) is skipped."""
    rows = []
    if not path.is_file():
        return rows
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def plot_run(run_dir: str | Path) -> list[Path]:
    """Write ``plots/*.png`` for the run in ``run_dir`` and return their paths.

    Reads ``metrics.jsonl`` (one row per update: ``update``, ``reward/mean``, ``pool/occupancy``,
    ``pool/rejected``) and ``staleness.jsonl`` (one row per consumed trajectory: ``gs``, ``ws``).
    """
    run = Path(run_dir)
    out = run / "plots"
    out.mkdir(parents=True, exist_ok=True)
    metrics = read_jsonl(run / "metrics.jsonl")
    consumed = read_jsonl(run / "staleness.jsonl")
    written = []

    steps = [m["update"] for m in metrics]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [m.get("reward/mean", float("nan")) for m in metrics], marker=".")
    ax.set(xlabel="update (policy version)", ylabel="mean reward of the batch", title="Reward")
    ax.grid(alpha=0.3)
    written.append(_save(fig, out / "reward.png"))

    for key, label in (("gs", "generation staleness GS"), ("ws", "waiting staleness WS")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        values = [c[key] for c in consumed if key in c]
        ax.hist(values, bins=20 if values else 1, color="tab:blue" if key == "gs" else "tab:orange")
        ax.set(xlabel=f"{label} (policy versions)", ylabel="trajectories", title=f"{label} of consumed trajectories")
        written.append(_save(fig, out / f"{key}_hist.png"))

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [m.get("pool/occupancy", 0) for m in metrics], label="pool occupancy (before selection)")
    ax.bar(steps, [m.get("pool/rejected", 0) for m in metrics], color="tab:red", alpha=0.6, label="rejected")
    ax.set(xlabel="update", ylabel="trajectories", title="Pool occupancy and rejections")
    ax.legend()
    written.append(_save(fig, out / "pool.png"))
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    tmp.replace(path)
    return path
