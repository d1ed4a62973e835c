"""``agentenv compare``: one recipe, four ways, the same number of updates.

Runs the recipe synchronously (no overlap: the baseline) and asynchronously with the staleness
policies ``none``, ``max_lag`` and ``pace``, each in its own run folder under ``--out``, then prints
and writes a table of training wall-clock time (the update loop, without model loading, warm-up or
held-out evaluation, which the comparison turns off unless ``eval.problems=N`` is passed), reward,
generation and waiting staleness, rejection rate, the share of the loop's wall-clock time the
generation engine was busy, and the overlap bound and overlap achieved of the engine, environments and
learner (:func:`agentenv.trainer.overlap.overlap`; None for a run that predates them). Each setting
trains in a child process of its own (:mod:`agentenv.trainer.run_process`), so memory one run leaves
behind cannot add up over the four.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from agentenv.configio import apply_overrides, load_config, read_yaml, split_overrides
from agentenv.errors import AgentEnvError
from agentenv.output_folders import claim_parent
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.plots import read_jsonl
from agentenv.trainer.recipe import prepare_run_dir, resolve_recipe
from agentenv.trainer.run_process import train_in_child

#: (name, staleness.policy); ``sync`` alternates generation and training, the others overlap them
SettingName = Literal["sync", "async-none", "async-max_lag", "async-pace"]
"""The settings compared, in the table's order: synchronous, then asynchronous under each staleness policy."""
SETTINGS = tuple(zip(get_args(SettingName), ("sync", "none", "max_lag", "pace"), strict=True))
"""``(setting, staleness.policy)`` pairs."""


def summarize(name: str, run_dir: Path) -> dict[str, Any]:
    """One table row from a finished run folder (summary.json, metrics.jsonl, staleness.jsonl)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    consumed = read_jsonl(run_dir / "staleness.jsonl")
    rejected = sum(m.get("pool/rejected", 0) for m in metrics)
    used = len(consumed)
    return {
        "setting": name,
        "updates": summary["updates"],
        "train_s": round(summary["train_s"], 1),
        "reward_mean": round(statistics.fmean(m["reward/mean"] for m in metrics), 4) if metrics else None,
        "reward_last5": round(statistics.fmean(m["reward/mean"] for m in metrics[-5:]), 4) if metrics else None,
        "gs_mean": round(statistics.fmean(c["gs"] for c in consumed), 3) if consumed else None,
        "ws_mean": round(statistics.fmean(c["ws"] for c in consumed), 3) if consumed else None,
        "rejection_rate": round(rejected / (rejected + used), 3) if rejected + used else 0.0,
        "engine_busy_share": round(metrics[-1]["engine/busy_share"], 3) if metrics else None,
        "overlap_bound": _rounded(summary.get("overlap/bound")),
        "overlap_achieved": _rounded(summary.get("overlap/achieved")),
    }


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def with_ratio_to_sync(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add ``time_vs_sync``: each setting's loop time over the synchronous baseline's (same updates).

    Below 1 means faster than synchronous RL; None when the baseline was not run (``--only``).
    """
    sync = next((r for r in rows if r["setting"] == "sync"), None)
    base = sync["train_s"] if sync and sync["train_s"] else None
    return [{**r, "time_vs_sync": round(r["train_s"] / base, 3) if base else None} for r in rows]


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a Markdown table."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


DESCRIPTION = ("Train one recipe synchronously and asynchronously (staleness policies none, max_lag, pace) for the "
               "same number of updates, and print a table of loop wall-clock time (and its ratio to the synchronous "
               "run), reward, GS/WS, rejection rate and engine busy share. section.field=value overrides, "
               "anywhere on the command line, apply to every setting. Example: agentenv compare --updates 10 "
               "--out runs/compare (about 30 minutes on 2 CPU cores)")


@dataclass(frozen=True)
class CompareArgs:
    """``agentenv compare``'s options (the overrides are read apart: :func:`agentenv.configio.is_override`).

    Attributes:
        recipe: Recipe name or YAML path.
        updates: Updates per setting.
        out: Folder for one run folder per setting and compare.md/.json.
        only: A subset of the settings (default: all four).
        overwrite: Replace existing run folders under --out.
    """

    recipe: str = "python_tool_cpu"
    updates: int = 10
    out: Path = Path("runs/compare")
    only: tuple[SettingName, ...] = ()
    overwrite: bool = False


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agentenv compare``: 0 when every setting finished, 130 when Ctrl-C stopped one, 2 on an error.

    The table (``compare.md``, ``compare.json`` under ``--out``) has the settings that finished, also
    after a stop or an error.
    """
    from agentenv.cli_args import parse

    options, overrides = split_overrides(list(sys.argv[1:] if argv is None else argv))
    args = parse(CompareArgs, options, prog="agentenv compare", conventions=False, description=DESCRIPTION)
    if isinstance(args, int):
        return args
    out = args.out
    rows, status = [], 0
    chosen = [s for s in SETTINGS if not args.only or s[0] in args.only]
    try:
        claim_parent(out, {s[0] for s in SETTINGS} | {"compare.md", "compare.json"}, "a comparison")
        base = apply_overrides(read_yaml(resolve_recipe(args.recipe)), ["eval.problems=0", *overrides])
        for i, (name, policy) in enumerate(chosen):
            data = apply_overrides(base, [f"staleness.policy={policy}",
                                          f"run.updates={args.updates}", f"run.run_dir={out / name}"])
            cfg = load_config(TrainConfig, data)
            run_dir = prepare_run_dir(cfg, resume=False, overwrite=args.overwrite)
            print(f"== {name} ==", file=sys.stderr)
            left = " ".join(n for n, _ in chosen[i:])
            finished, user_stop = train_in_child(
                cfg, run_dir, resume=False, seconds=None, head=name,
                then=f"run it again with --overwrite (add --only {left} to keep the settings that finished)")
            if finished:
                rows.append(summarize(name, run_dir))
            if user_stop:
                print(f"agentenv compare: stopped {'after' if finished else 'during'} {name}; the table has the "
                      "settings that finished", file=sys.stderr)
                status = 130
                break
    except AgentEnvError as exc:  # the table still gets the settings that finished before
        print(f"agentenv compare: {exc}", file=sys.stderr)
        status = 2
    if rows:
        rows = with_ratio_to_sync(rows)
        table = markdown_table(rows)
        print(table)
        (out / "compare.md").write_text(table + "\n")
        (out / "compare.json").write_text(json.dumps(rows, indent=2))
    return status
