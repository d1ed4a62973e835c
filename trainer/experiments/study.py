"""``agentenv study NAME``: the settings of one study (:mod:`agentenv.trainer.experiments.studies`), a table, plots.

Each setting trains the same base task with the same budget (updates, so rollouts; or wall-clock
seconds) in its own run folder under ``--run-dir``; then ``study.md``, ``study.json`` and
``plots/*.png`` are written from the runs' own logs (:mod:`agentenv.trainer.experiments.study_report`).
Each setting trains in a child process of its own. A setting that finished gets
``study_setting.json`` and is never run again; a setting stopped half-way (Ctrl-C, a killed
process) continues with train's resume. ``--seeds K`` runs every setting over K seeds
(:mod:`agentenv.trainer.experiments.seeded_study`).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from agentenv.configio import apply_overrides, load_config, read_yaml, split_overrides
from agentenv.errors import AgentEnvError, ConfigError, RunFolderError
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.experiments.studies import (
    BASE_OVERRIDES,
    BASE_RECIPE,
    QUICK_OVERRIDES,
    STUDIES,
    Setting,
    Study,
    budget,
)
from agentenv.trainer.experiments.study_report import (
    format_cell,
    plot_study,
    scale,
    study_markdown,
    study_row,
    table,
    table_columns,
    wilson_interval,
)
from agentenv.trainer.experiments.study_share import (
    MARKER,
    before_key,
    copy_finished,
    find_before,
    find_finished,
    has_before,
    setting_key,
)
from agentenv.trainer.run_process import train_in_child

__all__ = [
    "check_folder", "get_study", "main", "plot_study", "run_setting", "run_study", "setting_configs", "study_markdown",
    "study_row", "table", "wilson_interval", "write_json",
]


def get_study(name: str) -> Study:
    """The study called ``name``.

    Raises:
        ConfigError: No such study (the message lists the known ones), or it cannot run yet (why).
    """
    if name not in STUDIES:
        raise ConfigError(f"unknown study {name!r}; known studies: {', '.join(STUDIES)}")
    study = STUDIES[name]
    if study.not_runnable:
        raise ConfigError(f"study {name!r} cannot run yet: {study.not_runnable}")
    return study


def setting_configs(study: Study, root: Path, *, quick: bool, overrides: Sequence[str] = (), seed: int | None = None
                    ) -> list[tuple[Setting, TrainConfig]]:
    """Every setting's config (``--quick``: the first two), all checked before anything runs.

    With ``seed``, each setting runs with ``run.seed = seed`` in ``root/<setting>/seed<seed>``
    (``agentenv study --seeds K``); without it in ``root/<setting>``.

    Raises:
        ConfigError: A setting's config is invalid, or it cannot apply (a GRPO group larger than
            ``run.concurrency``: a group's rollouts play together); the message names the setting.
    """
    updates, seconds = budget(study, quick)
    base = apply_overrides(read_yaml(_recipe()), [*BASE_OVERRIDES, *(QUICK_OVERRIDES if quick else ()),
                                                  *study.extra])
    out = []
    for setting in study.settings[:2] if quick else study.settings:
        run_dir = root / setting.name if seed is None else root / setting.name / f"seed{seed}"
        more = ([f"run.run_dir={run_dir}"] + ([f"run.updates={updates}"] if updates is not None else [])
                + ([f"run.seed={seed}"] if seed is not None else []))
        try:
            cfg = load_config(TrainConfig, apply_overrides(base, [*setting.overrides, *overrides, *more]))
        except ConfigError as exc:
            raise ConfigError(f"study {study.name}, setting {setting.name}: {exc}") from exc
        if cfg.objective.name == "grpo" and cfg.objective.grpo_group_size > cfg.run.concurrency:
            raise ConfigError(f"study {study.name}, setting {setting.name} cannot apply: a GRPO group of "
                              f"{cfg.objective.grpo_group_size} rollouts is played at once, run.concurrency is "
                              f"{cfg.run.concurrency}")
        out.append((setting, cfg))
    return out


def _recipe() -> Path:
    from agentenv.trainer.recipe import resolve_recipe

    return resolve_recipe(BASE_RECIPE)


def check_folder(root: Path, study: Study, *, quick: bool, resume: bool, seeded: bool = False) -> None:
    """Refuse another study's (or mode's, or layout's) folder, a study begun without ``--resume``, a non-study folder.

    ``seeded``: the study runs with ``--seeds`` (its folders are ``<setting>/seed<k>``); a folder of
    the other layout is refused.

    Raises:
        RunFolderError: as above.
    """
    meta = root / "study.json"
    if meta.is_file():
        held = json.loads(meta.read_text())
        if held.get("study") != study.name:
            raise RunFolderError(f"{root} holds study {held.get('study')!r}, not {study.name!r}; "
                                 "choose another --run-dir")
        if bool(held.get("quick")) != quick:
            raise RunFolderError(f"{root} holds a {'--quick' if held.get('quick') else 'full'} run of "
                                 f"{study.name}; choose another --run-dir")
        if ("seeds" in held) != seeded:
            raise RunFolderError(f"{root} holds a run of {study.name} {'with' if 'seeds' in held else 'without'} "
                                 "--seeds; choose another --run-dir")
        if not resume:
            raise RunFolderError(f"{root} holds study {study.name} already; pass --resume to continue it "
                                 "(finished settings are kept)")
    elif root.exists() and any(root.iterdir()):
        raise RunFolderError(f"{root} holds files but no study.json: not a study folder")
    elif resume:
        raise RunFolderError(f"--resume: {root} holds no study; start it without --resume")


def run_study(name: str, root: Path, *, quick: bool = False, resume: bool = False, overrides: Sequence[str] = (),
              share: bool = True, log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> dict[str, Any]:
    """Run (or continue) study ``name`` in ``root``; write study.md, study.json and plots; return study.json's content.

    With ``share`` (the default) a setting identical to a finished one in a study folder beside ``root``
    is copied from it, and a setting's "before" held-out evaluation is copied from a run that starts
    from the same policy (:mod:`agentenv.trainer.experiments.study_share`); the copies say where they came from.
    ``interrupted`` in the result is True when Ctrl-C stopped a setting (the table then has the
    settings that finished).

    Raises:
        ConfigError: unknown or not-runnable study, a setting that cannot apply (before anything runs).
        RunFolderError: see :func:`check_folder`.
        AgentEnvError: a setting's process failed or was killed (:func:`~agentenv.trainer.run_process.train_in_child`).
    """
    study = get_study(name)
    configs = setting_configs(study, root, quick=quick, overrides=overrides)
    check_folder(root, study, quick=quick, resume=resume)
    root.mkdir(parents=True, exist_ok=True)
    _, seconds = budget(study, quick)
    result: dict[str, Any] = {"study": study.name, "quick": quick, "claim": study.claim,
                              "settings": [s.name for s, _ in configs], "overrides": list(overrides),
                              "scale": scale(configs[0][1], study, quick), "rows": [], "interrupted": False}
    write_json(root / "study.json", result)
    for i, (setting, cfg) in enumerate(configs, 1):
        run_dir = root / setting.name
        finished, user_stop = run_setting(study, setting, cfg, run_dir, root=root, seconds=seconds, share=share,
                                          log=log, head=f"[study {study.name}] {i}/{len(configs)} {setting.name}")
        if not finished:
            result["interrupted"] = True
            break
        row = study_row(study, setting.name, run_dir, reference=root / configs[0][0].name if i > 1 else None)
        log(f"[study {study.name}] {i}/{len(configs)} {setting.name}: "
            + ", ".join(f"{k}={format_cell(row, k)}" for k in table_columns(study)[1:] if k in row))
        result["rows"].append(row)
        if user_stop:  # Ctrl-C after the setting's run had finished: it is kept, the study stops here
            result["interrupted"] = True
            break
    if result["rows"]:
        plots = plot_study(study, root, [r["setting"] for r in result["rows"]], result["rows"])
        result["plots"] = [str(p.relative_to(root)) for p in plots]
        (root / "study.md").write_text(study_markdown(study, result))
    write_json(root / "study.json", result)
    return result


def run_setting(study: Study, setting: Setting, cfg: TrainConfig, run_dir: Path, *, root: Path,
                seconds: float | None, share: bool, log: Callable[[str], None], head: str) -> tuple[bool, bool]:
    """Train one setting in ``run_dir`` to its budget, or keep what finished before; ``(finished, user_stop)``.

    A folder that finished before (its marker) is kept; with ``share`` a finished identical setting
    in a study folder beside ``root`` (the study's folder) is copied
    (:mod:`~agentenv.trainer.experiments.study_share`); a folder stopped half-way resumes; else the
    setting starts afresh. ``finished`` is False when the run was stopped
    before its budget; ``user_stop`` is True when Ctrl-C came (after a finished run: keep it, stop
    the study).

    Raises:
        AgentEnvError: the setting's process failed or was killed.
    """
    if (run_dir / MARKER).is_file():
        log(f"{head}: finished before, kept")
        return True, False
    key = setting_key(cfg, seconds)
    partial = (run_dir / "config.yaml").is_file()
    if partial and _nothing_to_resume(run_dir):
        log(f"{head}: stopped before its first checkpoint (run.checkpoint_every = {cfg.run.checkpoint_every}): "
            "nothing to resume from, starting it again")
        partial = False
    parent = root.parent
    same = find_finished(parent, key, exclude=run_dir) if share and not partial else None
    if same is not None:
        copy_finished(same, run_dir)
        write_json(run_dir / MARKER, {"study": study.name, "setting": setting.name, "finished": True,
                                      "key": key, "shared_from": _relative(same, parent)})
        log(f"{head}: the same config and budget as {same}, which finished: copied, not rerun")
        return True, False
    if not partial:
        _start_setting(cfg, run_dir, parent if share else None, log=log, head=head)
    left = None if seconds is None else max(0.0, seconds - loop_seconds_spent(run_dir))
    log(f"{head}: {'resuming' if partial else 'training'} "
        + (f"for {left:.0f} s" if left is not None else f"to {cfg.run.updates} updates"))
    started = time.time()
    finished, user_stop = train_in_child(cfg, run_dir, resume=partial, seconds=left, head=head,
                                         then="run the same command with --resume")
    if seconds is not None:
        _add_loop_seconds(run_dir, since=started)
    if not finished:
        log(f"{head}: stopped; run the same command with --resume to continue")
        return False, user_stop
    write_json(run_dir / MARKER, {"study": study.name, "setting": setting.name, "finished": True, "key": key})
    if user_stop:
        log(f"{head}: stopped after this setting; run the same command with --resume to continue")
    return True, user_stop


#: A wall-clock setting's update-loop seconds over all its sessions (train's summary has the last one's).
BUDGET_FILE = "study_budget.json"


def loop_seconds_spent(run_dir: Path) -> float:
    """Update-loop seconds a setting has spent over its sessions so far (0 for a fresh one).

    A session killed without writing its summary (``kill -9``) is not counted: its work after the
    last checkpoint is lost too, and the resumed run gets that time again.
    """
    path = run_dir / BUDGET_FILE
    return float(json.loads(path.read_text())["loop_s"]) if path.is_file() else 0.0


def _add_loop_seconds(run_dir: Path, *, since: float) -> None:
    """Add the training process that just ended (its ``summary.json``'s ``train_s``) to :data:`BUDGET_FILE`.

    Only a ``summary.json`` written since ``since`` (seconds since the epoch; the process's start)
    counts: a process stopped or killed before it wrote one adds nothing (an earlier process's summary
    is not counted twice).
    """
    summary = run_dir / "summary.json"
    if not summary.is_file() or summary.stat().st_mtime < since:
        return
    spent = loop_seconds_spent(run_dir) + json.loads(summary.read_text())["train_s"]
    write_json(run_dir / BUDGET_FILE, {"loop_s": spent})


def _relative(path: Path, parent: Path) -> str:
    return str(path.resolve().relative_to(parent.resolve()))


def _start_setting(cfg: TrainConfig, run_dir: Path, share_in: Path | None, *, log: Callable[[str], None],
                   head: str) -> None:
    """Make a fresh run folder (a folder with no ``config.yaml`` holds no run).

    A folder started again (:func:`_nothing_to_resume`) keeps its ``eval_before.json`` when it is of
    the same policy (:func:`~agentenv.trainer.experiments.study_share.has_before`). Else, with ``share_in``, copy
    the "before" evaluation of a run under it that starts from the same policy (marked ``shared_from``).
    """
    own = run_dir / "eval_before.json"  # a setting started again keeps its own if it measured this policy
    kept = own.read_text() if has_before(run_dir, before_key(cfg)) else None
    if run_dir.exists():  # a setting folder inside a checked study folder (check_folder): the study's own
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    if kept is not None:
        own.write_text(kept)
        return
    source = find_before(share_in, cfg, exclude=run_dir) if share_in is not None and cfg.eval.problems else None
    if source is not None:
        report = json.loads((source / "eval_before.json").read_text())
        report["shared_from"] = _relative(source, share_in)
        write_json(run_dir / "eval_before.json", report)
        log(f"{head}: held-out 'before' evaluation ({report['success_rate']:.3f}) copied from {source}: the same "
            f"model, warm-up, rollout budgets, env and evaluation (key {before_key(cfg)})")


def _nothing_to_resume(run_dir: Path) -> bool:
    """True when a started setting has logged updates but no published checkpoint.

    Train's ``--resume`` refuses such a folder (killed before its first checkpoint: what it trained is
    lost), so the study trains the setting again.
    """
    from agentenv.trainer.checkpoint import latest_checkpoint
    from agentenv.trainer.resume import records_updates

    return latest_checkpoint(run_dir / "checkpoints") is None and records_updates(run_dir)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path`` atomically (a temporary file, then a rename)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def list_studies() -> str:
    """The known studies, one line each (a study that cannot run yet says why)."""
    return "\n".join(f"  {s.name:<28} " + (f"NOT YET RUNNABLE: {s.not_runnable}" if s.not_runnable else
                                           f"{len(s.settings)} settings: " + ", ".join(x.name for x in s.settings))
                     for s in STUDIES.values())


@dataclass(frozen=True)
class StudyArgs:
    """``agentenv study``'s options (the overrides are read apart: :func:`agentenv.configio.is_override`).

    Attributes:
        name: The study, or 'all': every runnable study, one after the other, in folders under --run-dir
            (default runs/study), sharing what is the same.
        quick: Two settings, a couple of updates, 4 held-out problems.
        run_dir: Study folder (default: runs/study/NAME, or NAME-quick).
        resume: Continue a stopped study (with 'all': every study started before, and start the others);
            finished settings are kept.
        share: Copy a finished identical setting and the 'before' evaluation from the study folders beside
            --run-dir (--no-share: run every setting afresh).
        seeds: Run every setting with seeds 0..K-1 (folders <setting>/seed<k>) and decide each of the
            study's claims: reproduced, contradicted or undecided; 'auto': the seeds that detect --effect
            with 80% power, given the default's measured spread.
        effect: With --seeds: the difference in held-out success to detect, in points.
        results: With --seeds: where each finished (setting, seed) writes its result (default:
            RUN_DIR/results); commit it (e.g. docs/studies/NAME) and --resume elsewhere skips what it holds.
    """

    name: Annotated[str, tyro.conf.Positional, tyro.conf.arg(metavar="NAME")]
    quick: bool = False
    run_dir: str | None = None
    resume: bool = False
    share: bool = True
    seeds: str | None = None
    effect: float = 10.0
    results: str | None = None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agentenv study``."""
    from agentenv.cli_args import parse

    options, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    args = parse(StudyArgs, options, prog="agentenv study", conventions=False,
                 description="Run the settings of one study of the papers' claims on the same task with equal "
                             "budgets; write one run folder per setting, study.md, study.json and plots. "
                             "section.field=value overrides, anywhere on the command line, apply to every "
                             "setting. Studies:\n" + list_studies())
    if isinstance(args, int):
        return args
    if args.seeds is None and args.results is not None:
        print("agentenv study: --results needs --seeds", file=sys.stderr)
        return 2
    suffix = "-quick" if args.quick else ""
    if args.name == "all":
        base = Path(args.run_dir or "runs/study")
        plan = [(name, base / f"{name}{suffix}") for name, s in STUDIES.items() if not s.not_runnable]
    else:
        plan = [(args.name, Path(args.run_dir or f"runs/study/{args.name}{suffix}"))]
    for name, root in plan:
        resume = args.resume and (len(plan) == 1 or (root / "study.json").is_file())
        try:
            if args.seeds is not None:
                from agentenv.trainer.experiments.seeded_study import plan_seeds, run_seeded_study

                effect = args.effect / 100
                results = Path(args.results) / name if args.results and len(plan) > 1 else args.results
                summary = run_seeded_study(name, root, seeds=plan_seeds(args.seeds, effect=effect), effect=effect,
                                           results=Path(results) if results else None, quick=args.quick,
                                           resume=resume, overrides=overrides, share=args.share)
                print((root / "study.md").read_text())
                if summary["interrupted"]:
                    return 130
                continue
            result = run_study(name, root, quick=args.quick, resume=resume, overrides=overrides,
                               share=args.share)
        except AgentEnvError as exc:
            print(f"agentenv study: {exc}", file=sys.stderr)
            return 2
        if result["rows"]:
            print(f"## {name}\n" if len(plan) > 1 else "", end="")
            print(table(STUDIES[name], result["rows"]))
            print(f"agentenv study: {root / 'study.md'}", file=sys.stderr)
        if result["interrupted"]:
            return 130
    return 0
