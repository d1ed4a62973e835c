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


#: Batches in the moving mean of the reward curve.
REWARD_WINDOW = 5


def moving_mean(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` values (fewer at the start); NaNs are skipped."""
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1) : i + 1] if v == v]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


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
    # batches consumed: a batch without gradient takes no step, so versions repeat; batches do not
    batches = [m.get("train/batches", m["update"]) for m in metrics]
    rewards = [m.get("reward/mean", float("nan")) for m in metrics]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(batches, rewards, marker=".", alpha=0.4, label="batch mean")
    ax.plot(batches, moving_mean(rewards, REWARD_WINDOW), color="tab:blue",
            label=f"moving mean ({REWARD_WINDOW} batches)")
    for label, color, x in (("before", "tab:green", 0), ("after", "tab:red", batches[-1] if batches else 0)):
        path = run / f"eval_{label}.json"
        if path.is_file():
            report = json.loads(path.read_text())
            ax.scatter([x], [report["success_rate"]], color=color, zorder=3, s=40,
                       label=f"held-out {label} (version {report['version']}): {report['success_rate']:.3f} "
                             f"({report['tasks']} tasks)")
    ax.set(xlabel="batch consumed", ylabel="reward / success", title="Training reward and held-out success")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
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
