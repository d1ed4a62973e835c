"""``agentenv study NAME --seeds K``: every setting over K seeds, and each of the study's claims decided.

One run of the default moves by several points from seed to seed (:data:`SEED_SPREAD`), more than
most differences the studies look for, so one seed per setting decides nothing. Here every setting
runs with seeds ``0 .. K-1`` (``run.seed``), in ``<study>/<setting>/seed<k>``; the seeds share the
greedy "before" evaluation (:func:`~agentenv.trainer.experiments.study_share.before_key`). Seeds
run in the outer loop, so a study stopped half-way has whole seeds of every setting to compare.

**K.** ``--seeds auto`` takes the seeds that detect a difference of ``effect`` in held-out success
between two settings with 80% power at the 5% level, given one run's spread
(:func:`~agentenv.trainer.experiments.significance.seeds_for_effect`); the table says what
difference its K could detect (:func:`~agentenv.trainer.experiments.significance.detectable_effect`).

**Results that outlive the run folders.** Each finished (setting, seed) writes
``<results>/<setting>/seed<k>.json`` (its table row, its held-out outcomes per task); the table reads
only these files. Commit them (``--results docs/studies/NAME``) and ``--resume`` on another machine
skips every (setting, seed) already there, without its run folder.

**The rule** (:func:`decide`). Each :class:`~agentenv.trainer.experiments.studies.Expectation` is
the claim's sign for one setting against another on one figure. The difference is paired by seed
(the same seed's task stream in both settings) and, for held-out success, by task, with a 95%
interval that resamples seeds, then tasks (a per-run figure: seeds only). "reproduced": the interval
lies on the claimed side of zero (for ``not_lower``: above minus ``effect``); "contradicted": it
lies on the other side; "undecided at this scale": it holds zero.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.experiments import study as runner
from agentenv.trainer.experiments import study_report
from agentenv.trainer.experiments.significance import (
    detectable_effect,
    seed_bootstrap,
    seed_task_bootstrap,
    seeds_for_effect,
)
from agentenv.trainer.experiments.studies import SEED_SPREAD, Expectation, Study, budget

__all__ = [
    "compare",
    "decide",
    "plan_seeds",
    "read_results",
    "run_seeded_study",
    "seed_result",
    "seeded_markdown",
    "seeded_summary",
]

#: Verdicts of :func:`decide`.
REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "undecided at this scale"


def plan_seeds(seeds: str | int, *, effect: float, sd: float = SEED_SPREAD, power: float = 0.8) -> int:
    """K: ``seeds`` as given (>= 1), or for ``"auto"`` the seeds that detect ``effect`` with ``power``.

    Args:
        seeds: A count, or ``"auto"``.
        effect: The difference in held-out success to detect (fraction; 0.1 is 10 points).
        sd: One run's spread of held-out success (fraction).
        power: The chance of detecting a true difference of ``effect``.

    Raises:
        ConfigError: A count below 1 or a word other than ``"auto"``.
    """
    if seeds == "auto":
        return seeds_for_effect(sd, effect, power=power)
    try:
        k = int(seeds)
    except ValueError:
        raise ConfigError(f"--seeds takes a count >= 1 or 'auto', got {seeds!r}") from None
    if k < 1:
        raise ConfigError(f"--seeds takes a count >= 1 or 'auto', got {seeds!r}")
    return k


def decide(direction: str, low: float, high: float, margin: float) -> str:
    """The verdict on a claimed difference from its 95% interval ``[low, high]`` (see the module docstring).

    Args:
        direction: ``"higher"``, ``"lower"`` or ``"not_lower"``.
        low: The interval's lower end, of (setting - reference).
        high: Its upper end.
        margin: For ``"not_lower"``: how far below the reference still counts as matching it (> 0).

    Raises:
        DataError: an unknown direction, or ``low > high``.
    """
    if low > high:
        raise DataError(f"an interval needs low <= high, got [{low}, {high}]")
    if direction == "higher":
        return REPRODUCED if low > 0 else CONTRADICTED if high < 0 else UNDECIDED
    if direction == "lower":
        return REPRODUCED if high < 0 else CONTRADICTED if low > 0 else UNDECIDED
    if direction == "not_lower":
        return REPRODUCED if low > -margin else CONTRADICTED if high < 0 else UNDECIDED
    raise DataError(f"unknown direction {direction!r}: 'higher', 'lower' or 'not_lower'")


# ---------------------------------------------------------------------------------------------
# one (setting, seed): its result file
# ---------------------------------------------------------------------------------------------
def _outcomes(report: Mapping[str, Any]) -> dict[str, Any]:
    ids = report.get("task_ids") or [str(i) for i in range(len(report["outcomes"]))]
    return {"success_rate": report["success_rate"], "task_ids": list(ids), "outcomes": list(report["outcomes"])}


def seed_result(row: Mapping[str, Any], run_dir: Path, *, seed: int) -> dict[str, Any]:
    """The record kept for one finished (setting, seed): its table row and its held-out outcomes per task.

    Args:
        row: The run's :func:`~agentenv.trainer.experiments.study_report.study_row`.
        run_dir: Its run folder (``eval_before.json``, ``eval_after.json`` where present).
        seed: The run's ``run.seed``.
    """
    out: dict[str, Any] = {"setting": row["setting"], "seed": seed, "row": dict(row)}
    for label in ("before", "after"):
        path = run_dir / f"eval_{label}.json"
        out[label] = _outcomes(json.loads(path.read_text())) if path.is_file() else None
    return out


def result_path(results: Path, setting: str, seed: int) -> Path:
    """``<results>/<setting>/seed<seed>.json``."""
    return results / setting / f"seed{seed}.json"


def write_result(results: Path, record: dict[str, Any]) -> Path:
    """Write one (setting, seed) record atomically; return its path."""
    path = result_path(results, record["setting"], record["seed"])
    path.parent.mkdir(parents=True, exist_ok=True)
    runner.write_json(path, record)
    return path


def read_results(results: Path, study: Study) -> dict[tuple[str, int], dict[str, Any]]:
    """Every (setting, seed) record of ``study``'s settings under ``results``.

    Raises:
        DataError: a record that does not read, or whose setting or seed is not its file's.
    """
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for setting in study.settings:
        for path in sorted((results / setting.name).glob("seed*.json")):
            try:
                record = json.loads(path.read_text())
                seed = int(path.stem.removeprefix("seed"))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: not a study result ({exc})") from exc
            if record.get("setting") != setting.name or record.get("seed") != seed:
                raise DataError(f"{path}: holds setting {record.get('setting')!r} seed {record.get('seed')!r}")
            out[setting.name, seed] = record
    return out


# ---------------------------------------------------------------------------------------------
# the table and the verdicts
# ---------------------------------------------------------------------------------------------
def compare(expectation: Expectation, records: Mapping[tuple[str, int], Mapping[str, Any]], *, effect: float,
            resamples: int = 10_000) -> dict[str, Any]:
    """One claim against the seeds both its settings finished: the paired difference, its interval, the verdict.

    Args:
        expectation: The claim (setting, reference, direction, figure).
        records: ``read_results``'s (setting, seed) records.
        effect: The study's stated effect (``not_lower``'s margin; fraction for held-out success).
        resamples: Bootstrap resamples.

    Returns:
        ``{"setting", "reference", "figure", "direction", "seeds": [...], "difference", "ci95",
        "verdict"}``; with no seed of both (or a figure missing in one), ``difference`` None and
        ``verdict`` "undecided at this scale".
    """
    e = expectation
    both = sorted(s for (name, s) in records if name == e.setting and (e.reference, s) in records)
    ref, new = ({s: records[n, s] for s in both} for n in (e.reference, e.setting))
    out: dict[str, Any] = {"setting": e.setting, "reference": e.reference, "figure": e.figure,
                           "direction": e.direction, "seeds": [], "difference": None, "ci95": None,
                           "verdict": UNDECIDED}
    if e.figure == "success_after":
        seeds = [s for s in both if ref[s]["after"] is not None and new[s]["after"] is not None]
        if not seeds:
            return out
        aligned = [study_report.paired_outcomes(ref[s]["after"], new[s]["after"], f"{e.setting} against {e.reference}")
                   for s in seeds]
        iv = seed_task_bootstrap([r for r, _ in aligned], [x for _, x in aligned], resamples=resamples)
        diff, low, high = iv.delta, iv.low, iv.high
    else:
        seeds = [s for s in both if ref[s]["row"].get(e.figure) is not None and new[s]["row"].get(e.figure) is not None]
        if not seeds:
            return out
        diffs = [new[s]["row"][e.figure] - ref[s]["row"][e.figure] for s in seeds]
        diff = statistics.fmean(diffs)
        low, high = seed_bootstrap(diffs, resamples=resamples)
    out.update(seeds=seeds, difference=round(diff, 4), ci95=[round(low, 4), round(high, 4)],
               verdict=decide(e.direction, low, high, effect) if len(seeds) > 1 else UNDECIDED)
    return out


def seeded_summary(study: Study, records: Mapping[tuple[str, int], Mapping[str, Any]], *, seeds: int,
                   effect: float, sd: float = SEED_SPREAD) -> dict[str, Any]:
    """The study over its seeds: per setting the spread of held-out success after, per claim the verdict.

    A claim needs two seeds of both settings for a verdict (one seed has no seed-to-seed spread to
    resample). ``detectable`` is the difference in held-out success that ``seeds`` seeds detect with
    80% power, given ``sd``; ``measured_sd`` the spread of held-out success after in this study,
    pooled over the settings with two seeds or more (None without any), to size the next one.
    """
    settings = []
    for setting in study.settings:
        done = sorted(s for (name, s) in records if name == setting.name)
        rows = [records[setting.name, s]["row"] for s in done]
        after = [records[setting.name, s]["after"]["success_rate"] for s in done
                 if records[setting.name, s]["after"] is not None]
        figures = {key: study_report.mean_of([r.get(key) for r in rows])
                   for key in study.figures if key != "success_after"}
        settings.append({
            "setting": setting.name, "seeds": done, "after_mean": study_report.mean_of(after),
            "after_sd": round(statistics.stdev(after), 4) if len(after) > 1 else None,
            "after_min": min(after) if after else None, "after_max": max(after) if after else None,
            "gain_mean": study_report.mean_of([r.get("gain") for r in rows]), "figures": figures,
        })
    # the spread measured here, pooled over the settings with two seeds or more (df-weighted variances)
    pooled = [(len(x["seeds"]) - 1, x["after_sd"]) for x in settings if x["after_sd"] is not None]
    df = sum(d for d, _ in pooled)
    measured = round(math.sqrt(sum(d * v * v for d, v in pooled) / df), 4) if df else None
    return {"study": study.name, "seeds_planned": seeds, "effect": effect, "sd": sd, "measured_sd": measured,
            "detectable": round(detectable_effect(sd, seeds), 4), "settings": settings,
            "claims": [compare(e, records, effect=effect) for e in study.expect]}


def _pts(x: float | None, signed: bool = False) -> str:
    if x is None:
        return "n/a"
    return f"{100 * x:+.1f}" if signed else f"{100 * x:.1f}"


def seeded_markdown(study: Study, summary: Mapping[str, Any], scale: str) -> str:
    """study.md of a study over seeds: the claim, the scale, the settings' spread, each claim's verdict."""
    lines = [f"# Study {study.name}, over seeds", "", f"Claim (the papers, at 1.5B-8B scale): {study.claim}.", "",
             f"Scale here: {scale}.", "",
             f"Seeds: {summary['seeds_planned']} per setting, seeds 0-{summary['seeds_planned'] - 1}. With one run's "
             f"spread of {_pts(summary['sd'])} points (sd of held-out success over seeds of the default), "
             f"{summary['seeds_planned']} seeds detect a difference of {_pts(summary['detectable'])} points in "
             "held-out success with 80% power at the 5% level"
             + (f"; the spread measured here, pooled over settings: {_pts(summary['measured_sd'])} points."
                if summary["measured_sd"] is not None else "."), "",
             "| setting | seeds | after: mean | sd | range | gain: mean | "
             + " | ".join(k for k in study.figures if k != "success_after") + " |",
             "|---|---:|---:|---:|---|---:|" + "---:|" * sum(k != "success_after" for k in study.figures)]
    for s in summary["settings"]:
        figs = " | ".join("n/a" if s["figures"].get(k) is None else f"{s['figures'][k]:g}"
                          for k in study.figures if k != "success_after")
        rng = f"{_pts(s['after_min'])}-{_pts(s['after_max'])}" if s["after_min"] is not None else "n/a"
        lines.append(f"| {s['setting']} | {len(s['seeds'])} | {_pts(s['after_mean'])} | {_pts(s['after_sd'])} | "
                     f"{rng} | {_pts(s['gain_mean'], True)} | {figs} |")
    lines += ["", "Held-out success in points (percent of the held-out tasks); `gain`: after minus before.", "",
              "| claim | figure | seeds | difference [95% CI] | verdict |", "|---|---|---:|---|---|"]
    for c in summary["claims"]:
        success = c["figure"] == "success_after"
        if c["difference"] is None:
            diff = "n/a"
        elif success:
            diff = f"{_pts(c['difference'], True)} [{_pts(c['ci95'][0], True)}, {_pts(c['ci95'][1], True)}] points"
        else:
            diff = f"{c['difference']:+g} [{c['ci95'][0]:+g}, {c['ci95'][1]:+g}]"
        claim = f"`{c['setting']}` {c['direction'].replace('_', ' ')} than `{c['reference']}`"
        lines.append(f"| {claim} | {c['figure']} | {len(c['seeds'])} | {diff} | {c['verdict']} |")
    lines += ["", "The difference is the setting's minus the reference's, paired by seed (and, for held-out "
              "success, by task), with a 95% interval that resamples seeds, then tasks. Reproduced: the interval "
              "lies on the claimed side of zero (`not lower`: above minus "
              f"{_pts(summary['effect'])} points); contradicted: on the other side; undecided: it holds zero. "
              "A verdict needs two seeds of both settings.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# the runner
# ---------------------------------------------------------------------------------------------
def run_seeded_study(name: str, root: Path, *, seeds: int, effect: float, results: Path | None = None,
                     quick: bool = False, resume: bool = False, overrides: Sequence[str] = (), share: bool = True,
                     log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict[str, Any]:
    """Run (or continue) study ``name`` over ``seeds`` seeds in ``root``; write the results, study.md and study.json.

    Seeds in the outer loop, settings in the inner; a (setting, seed) whose result file is in
    ``results`` (default ``root/results``) is not run again, with or without its run folder.

    Returns:
        study.json's content: the summary (:func:`seeded_summary`) with ``interrupted``.

    Raises:
        ConfigError, RunFolderError, AgentEnvError: as :func:`~agentenv.trainer.experiments.study.run_study`.
    """
    study = runner.get_study(name)
    if not study.expect:
        raise ConfigError(f"study {name!r} states no expectation to decide (Study.expect)")
    if not 0 < effect < 1:
        raise ConfigError(f"--effect is a difference in held-out success in (0, 100) points, got {100 * effect:g}")
    results = results or root / "results"
    plan = [(k, runner.setting_configs(study, root, quick=quick, overrides=overrides, seed=k)) for k in range(seeds)]
    runner.check_folder(root, study, quick=quick, resume=resume, seeded=True)
    root.mkdir(parents=True, exist_ok=True)
    _, seconds = budget(study, quick)
    described = study_report.scale(plan[0][1][0][1], study, quick)
    head_json = {"study": study.name, "quick": quick, "seeds": seeds, "results": str(results)}
    runner.write_json(root / "study.json", head_json)  # the folder is this study's from now on
    interrupted = False
    for k, configs in plan:
        for i, (setting, cfg) in enumerate(configs, 1):
            head = f"[study {study.name}] seed {k + 1}/{seeds}, {i}/{len(configs)} {setting.name}"
            if result_path(results, setting.name, k).is_file():
                log(f"{head}: in {results}, kept")
                continue
            run_dir = root / setting.name / f"seed{k}"
            finished, user_stop = runner.run_setting(study, setting, cfg, run_dir, root=root, seconds=seconds,
                                                     share=share, log=log, head=head)
            if finished:
                row = study_report.study_row(study, setting.name, run_dir)
                log(f"{head}: written to {write_result(results, seed_result(row, run_dir, seed=k))}")
            if not finished or user_stop:
                interrupted = True
                break
        if interrupted:
            break
    summary = {**seeded_summary(study, read_results(results, study), seeds=seeds, effect=effect),
               "quick": quick, "overrides": list(overrides), "scale": described, "interrupted": interrupted}
    (root / "study.md").write_text(seeded_markdown(study, summary, described)
                                   + ("\nStopped before every seed finished: `--resume` continues.\n"
                                      if interrupted else ""))
    runner.write_json(root / "study.json", {**head_json, **summary})
    return summary
