"""A study's report from its runs' own logs: one row per setting, the Markdown table and study.md, the plots.

:func:`study_row` reads a setting's run folder (``summary.json``, ``metrics.jsonl``,
``staleness.jsonl``, ``eval_*.json``); :func:`table` and :func:`study_markdown` render the rows;
:func:`plot_study` draws ``plots/*.png``. The runner is :mod:`agentenv.trainer.experiments.study`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentenv.errors import DataError
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.experiments.compare import markdown_table, summarize
from agentenv.trainer.experiments.significance import Z95, paired_bootstrap
from agentenv.trainer.experiments.studies import FIGURES, Study, budget
from agentenv.trainer.experiments.study_share import MARKER

__all__ = [
    "PAIRED", "format_cell", "mean_of", "paired_outcomes", "plot_study", "scale", "study_markdown", "study_row",
    "table", "table_columns", "wilson_interval",
]


def wilson_interval(successes: float, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a success rate ``successes / n`` (Wilson 1927; good at p near 0 or 1).

    Raises:
        DataError: ``n < 1`` or ``successes`` outside ``[0, n]``.
    """
    if n < 1 or not 0 <= successes <= n:
        raise DataError(f"a rate needs n >= 1 and 0 <= successes <= n, got {successes} of {n}")
    p, z2 = successes / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mean_of(xs: Sequence[float | None]) -> float | None:
    """The mean of the values that are not None or NaN, rounded to 4 decimals; None when there are none."""
    xs = [x for x in xs if x is not None and x == x]
    return round(statistics.fmean(xs), 4) if xs else None


def _failed_tokens(records: Sequence[dict[str, Any]], last: int = 5) -> float | None:
    """Mean policy tokens of the failed (reward <= 0) trajectories consumed at the ``last`` latest versions.

    ``records`` are ``staleness.jsonl`` lines (``version``: the learner's version that consumed the
    trajectory); None when no such trajectory was recorded (or the run did not record lengths).
    """
    records = [r for r in records if r.get("policy_tokens") is not None and r.get("reward") is not None]
    latest = set(sorted({r["version"] for r in records})[-last:])
    return mean_of([r["policy_tokens"] for r in records if r["version"] in latest and r["reward"] <= 0])


def paired_outcomes(a: dict[str, Any], b: dict[str, Any], what: str) -> tuple[list[float], list[float]]:
    """Two evaluations' per-task outcomes in the same task order (by ``task_ids`` where both have them).

    Raises:
        DataError: the two evaluations are not of the same tasks (or list a task twice).
    """
    if "task_ids" not in a or "task_ids" not in b:
        if len(a["outcomes"]) != len(b["outcomes"]):
            raise DataError(f"{what}: {len(a['outcomes'])} and {len(b['outcomes'])} held-out outcomes cannot be paired")
        return a["outcomes"], b["outcomes"]
    for e in (a, b):
        if len(e["task_ids"]) != len(e["outcomes"]) or len(set(e["task_ids"])) != len(e["task_ids"]):
            raise DataError(f"{what}: an evaluation whose task ids are repeated or do not match its outcomes")
    by_id = dict(zip(b["task_ids"], b["outcomes"], strict=True))
    if sorted(by_id) != sorted(a["task_ids"]):
        raise DataError(f"{what}: the two held-out evaluations are not of the same tasks")
    return a["outcomes"], [by_id[t] for t in a["task_ids"]]


def _paired_delta(before: dict[str, Any], after: dict[str, Any], what: str) -> tuple[float, list[float]]:
    """``mean(after) - mean(before)`` over the same tasks and its paired-bootstrap 95% interval (rounded)."""
    iv = paired_bootstrap(*paired_outcomes(before, after, what))
    return round(iv.delta, 4), [round(iv.low, 4), round(iv.high, 4)]


def study_row(study: Study, setting: str, run_dir: Path, reference: Path | None = None) -> dict[str, Any]:
    """One table row from a setting's run folder: the study's figures, wall-clock, updates, rollouts.

    Rates (``success_*``) come with ``<name>_ci95``, the Wilson interval over the held-out tasks. A
    study with ``success_after`` also gets two paired differences over the same held-out tasks, each
    with its paired-bootstrap 95% interval (:func:`agentenv.trainer.experiments.significance.paired_bootstrap`;
    fractions, 0.1 is 10 points): ``gain`` (this setting's after minus its before) and ``vs_first``
    (this setting's after minus the ``reference`` setting's after; None without a reference). A pair
    is tighter than the two Wilson intervals side by side, since the same tasks tend to succeed in both.

    Two evaluations that cannot be paired (not the same tasks) leave both None and say why in
    ``paired_error`` (study.md lists it).
    """
    from agentenv.trainer.plots import read_jsonl

    base = summarize(setting, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    evals = {k: json.loads(p.read_text()) for k in ("before", "after") if (p := run_dir / f"eval_{k}.json").is_file()}
    rewards = [m["reward/mean"] for m in metrics]
    values: dict[str, Any] = {
        "tool_calls": mean_of([m.get("tools/calls") for m in metrics[-5:]]),
        "tool_calls_after": evals["after"]["tool_calls_mean"] if "after" in evals else None,
        "reward_last5": base["reward_last5"],
        "reward_std": round(statistics.pstdev(rewards), 4) if len(rewards) > 1 else None,
        "response_tokens": mean_of([m.get("length/policy_tokens") for m in metrics]),
        "truncated": mean_of([m.get("length/truncated") for m in metrics]),  # runs before it was logged: None
        "turns": mean_of([m.get("length/turns") for m in metrics]),
        "failed_tokens": _failed_tokens(read_jsonl(run_dir / "staleness.jsonl")),
        "rho_truncated": mean_of([m.get("learner/rho_truncated_fraction") for m in metrics]),
        "admitted": mean_of([m.get("learner/admitted_fraction") for m in metrics]),
        "admitted_tokens": mean_of([m.get("learner/admitted_token_fraction") for m in metrics]),
        "lag_mean": (round(base["gs_mean"] + base["ws_mean"], 3)
                     if base["gs_mean"] is not None and base["ws_mean"] is not None else None),
        "mean_d": mean_of([m.get("learner/mean_d") for m in metrics]),
        "gs_mean": base["gs_mean"], "ws_mean": base["ws_mean"], "rejection_rate": base["rejection_rate"],
    }
    row: dict[str, Any] = {"setting": setting}
    for key in study.figures:
        if key.startswith("success_"):
            report = evals.get(key.removeprefix("success_"))
            row[key] = report["success_rate"] if report else None
            row[f"{key}_ci95"] = (list(map(lambda x: round(x, 4), wilson_interval(sum(report["outcomes"]),
                                                                                 len(report["outcomes"]))))
                                  if report else None)
        else:
            row[key] = values[key]
    if "success_after" in study.figures:
        after = evals.get("after")
        row.update(gain=None, gain_ci95=None, vs_first=None, vs_first_ci95=None)
        ref = reference / "eval_after.json" if reference is not None else None
        try:  # two evaluations that cannot be paired leave n/a and say why, not a study without a table
            if after and "before" in evals:
                row["gain"], row["gain_ci95"] = _paired_delta(evals["before"], after, str(run_dir))
            if after and ref is not None and ref.is_file():
                row["vs_first"], row["vs_first_ci95"] = _paired_delta(json.loads(ref.read_text()), after,
                                                                      f"{run_dir} against {reference}")
        except DataError as exc:  # _paired_outcomes checks the lengths, so the zip cannot raise
            row["paired_error"] = str(exc)
    # a copied "before" evaluation is counted at its measured seconds, so that wall-clocks compare
    shared_before = (evals.get("before") or {}).get("shared_from")
    wall = summary["wall_clock_s"] + (evals["before"]["seconds"] if shared_before else 0.0)
    row.update(wall_clock_s=round(wall, 1), train_s=base["train_s"], updates=summary["updates"],
               rollouts=len(read_jsonl(run_dir / "staleness.jsonl")))
    marker = json.loads((run_dir / MARKER).read_text()) if (run_dir / MARKER).is_file() else {}
    row.update(shared_from=marker.get("shared_from"), before_shared_from=shared_before)
    return row


#: Paired differences of held-out success (signed; see :func:`study_row`).
PAIRED = ("gain", "vs_first")


def format_cell(row: dict[str, Any], key: str) -> str:
    """One table cell: ``n/a``, a value, a rate with its interval, or a signed paired difference with its interval."""
    value = row.get(key)
    if value is None:
        return "n/a"
    ci = row.get(f"{key}_ci95")
    if ci and key in PAIRED:
        return f"{value:+.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}]"
    return f"{value:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else str(value)


def table_columns(study: Study) -> list[str]:
    """The table's columns: setting, the study's figures, the paired differences (with held-out success), budget."""
    return ["setting", *study.figures, *(PAIRED if "success_after" in study.figures else ()),
            "wall_clock_s", "train_s", "updates", "rollouts"]


def table(study: Study, rows: list[dict[str, Any]]) -> str:
    """The rows as Markdown: setting, figures, paired differences, wall-clock, updates, rollouts.

    Rates carry their interval; the paired differences appear in studies with held-out success, the
    first row being the reference.
    """
    cells = [{c: format_cell(r, c) for c in table_columns(study)} for r in rows]
    if cells and "vs_first" in cells[0] and rows[0].get("success_after") is not None:
        cells[0]["vs_first"] = "(reference)"
    return markdown_table(cells)


def scale(cfg: TrainConfig, study: Study, quick: bool) -> str:
    """One line saying at what scale the study ran (model, task, B, budget, held-out problems, overrides)."""
    _, seconds = budget(study, quick)
    spent = (f"{seconds:.0f} s of wall-clock per setting" if seconds is not None
             else f"{cfg.run.updates} updates per setting")
    return (f"model {cfg.model.name or 'SmolLM2-135M-Instruct (embedded)'}, task {cfg.env.id}/"
            f"{cfg.env.kwargs.get('dataset')}, B = {cfg.run.batch_size}, {spent}, "
            f"{cfg.eval.problems} held-out problems ({cfg.env.eval_kwargs.get('dataset')})"
            + (f"; every setting with {', '.join(study.extra)}" if study.extra else "")
            + (" (--quick: a check that the study runs, not a measurement)" if quick else ""))


def study_markdown(study: Study, result: dict[str, Any]) -> str:
    """study.md: the claim, the scale, the table, the legend, the plots."""
    lines = [f"# Study {study.name}", "", f"Claim (the papers, at 1.5B-8B scale): {study.claim}.", "",
             f"Scale here: {result['scale']}. The papers' models are 10-60x larger and trained for thousands "
             "of updates; a claim that does not show here is not refuted, and one that shows is not confirmed "
             "beyond this scale.", "", table(study, result["rows"]), "",
             "Columns: " + "; ".join(f"`{k}`: {FIGURES[k]}" for k in table_columns(study) if k in FIGURES)
             + "; `wall_clock_s`: the whole run (model load, warm-up, evaluations); `train_s`: the update loop; "
               "`rollouts`: trajectories trained on.", ""]
    shared = [f"`{r['setting']}` is the run `{r['shared_from']}` (the same config and budget), copied: one run, "
              "shown in both studies" for r in result["rows"] if r.get("shared_from")]
    shared += [f"`{r['setting']}`'s before-evaluation is `{r['before_shared_from']}`'s (the same model, warm-up, "
               "env and greedy evaluation; counted in its `wall_clock_s`)" for r in result["rows"]
               if r.get("before_shared_from") and not r.get("shared_from")]
    if shared:
        lines += ["Shared, not rerun: " + "; ".join(shared) + ".", ""]
    unpaired = [f"`{r['setting']}`: {r['paired_error']}" for r in result["rows"] if r.get("paired_error")]
    if unpaired:
        lines += ["Not paired (n/a): " + "; ".join(unpaired) + ".", ""]
    if result.get("interrupted"):
        lines += ["Stopped before every setting finished: `agentenv study ... --resume` continues.", ""]
    lines += [f"![{p}]({p})" for p in result.get("plots", [])]
    return "\n".join(lines) + "\n"


def plot_study(study: Study, root: Path, settings: list[str], rows: list[dict[str, Any]]) -> list[Path]:
    """Write the study's plots and return their paths.

    ``plots/reward.png`` and ``plots/tool_calls.png``: curves over batches, one line per setting;
    ``plots/figure_<first figure>.png``: one bar per setting (rates with their 95% interval); for
    the studies of staleness (``gs_mean`` among the figures) ``plots/staleness.png``: the empirical
    distribution (CDF) of generation and waiting staleness of the consumed trajectories (policy
    versions, ``staleness.jsonl``), one line per setting.
    """
    import matplotlib.pyplot as plt

    from agentenv.trainer.plots import _save, moving_mean, read_jsonl

    out = root / "plots"
    out.mkdir(exist_ok=True)
    written = []
    for key, name, label in (("reward/mean", "reward", "training reward (moving mean, 3 updates)"),
                             ("tools/calls", "tool_calls", "tool calls per trajectory")):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for s in settings:
            metrics = read_jsonl(root / s / "metrics.jsonl")
            ys = [m.get(key, float("nan")) for m in metrics]
            ax.plot([m["train/batches"] for m in metrics], moving_mean(ys, 3) if name == "reward" else ys,
                    marker=".", label=s)
        ax.set(xlabel="batch consumed", ylabel=label, title=f"{study.name}: {label}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        written.append(_save(fig, out / f"{name}.png"))
    key = study.figures[0]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    vals = [r[key] if r[key] is not None else float("nan") for r in rows]
    cis = [r.get(f"{key}_ci95") for r in rows]
    err = None
    if all(cis):
        err = [[v - c[0] for v, c in zip(vals, cis, strict=True)], [c[1] - v for v, c in zip(vals, cis, strict=True)]]
    bars = ax.bar([r["setting"] for r in rows], vals, yerr=err, capsize=4, color="tab:blue")
    ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set(ylabel=key)
    ax.set_title(f"{study.name}: {FIGURES[key]}", fontsize=8, wrap=True)
    ax.tick_params(axis="x", labelsize=7)
    written.append(_save(fig, out / f"figure_{key}.png"))
    if "gs_mean" in study.figures:
        written.append(_plot_staleness(study, root, settings, out))
    return written


def _plot_staleness(study: Study, root: Path, settings: list[str], out: Path) -> Path:
    """``plots/staleness.png``: the CDFs of GS and WS (versions) of each setting's consumed trajectories."""
    import matplotlib.pyplot as plt

    from agentenv.trainer.plots import _save, read_jsonl

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for s in settings:
        records = read_jsonl(root / s / "staleness.jsonl")
        for ax, key in zip(axes, ("gs", "ws"), strict=True):
            xs = sorted(r[key] for r in records)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"{s} ({len(xs)})")
    for ax, name in zip(axes, ("generation staleness GS", "waiting staleness WS"), strict=True):
        ax.set(xlabel=f"{name} (policy versions)", title=f"{study.name}: {name}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of consumed trajectories <= x")
    axes[1].legend(fontsize=7)
    return _save(fig, out / "staleness.png")
