"""Lossless resume: what a checkpoint holds of an asynchronous run in flight, and how ``--resume`` restores it.

The model, optimizer, scheduler and RNG states (torch, numpy, python) are files of the checkpoint
(:mod:`agentenv.trainer.checkpoint`). Its ``extra`` holds the *run state* (:func:`run_state`, format
:data:`RUN_STATE_FORMAT`), taken on the event loop in one go, so its parts agree with each other and
with the learner's version:

* ``pool``: the completed trajectories waiting for a batch, each with its tokens, behaviour
  log-probabilities, segments (``version``, ``prefix_version``) and completion version; PACE's
  smoothed rate and the decision counter (:meth:`agentenv.rollout.pool.TrajectoryPool.state_dict`);
* ``collector``: the task stream: the next fresh seed (the data set's position), the tasks in flight,
  the requeued ones (:meth:`agentenv.rollout.collector.RolloutCollector.state_dict`);
* ``logs``: the length in bytes of ``metrics.jsonl``, ``staleness.jsonl`` and ``decisions.jsonl``;
* ``identity``: model, environment and its arguments, objective, group size and the run folder's id
  (``run.json``);
* ``resumes``: the resumes so far and the in-flight tasks they requeued, counted along the run's
  surviving history, as its logs are (a resume from a checkpoint written before an earlier resume
  undoes that one; ``resumes.jsonl`` lists every resume).

:func:`resume` (``agentenv train --resume``), in this order, changing nothing until every check passed:

1. reads the latest checkpoint's ``meta.json`` and refuses, naming the file, a checkpoint of another
   run or config, a run state of a newer format, a pool state this code cannot read;
2. restores the learner (every file's size and checksum verified first), the pool, and the task
   stream: the tasks that were in flight are requeued and played anew from their start (their
   partial episodes are lost), counted in ``resume/requeued_tasks_total``;
3. removes what a save killed mid-way left (:func:`~agentenv.trainer.checkpoint.discard_unpublished`)
   and cuts the logs back to the lengths the checkpoint recorded, so the updates redone after it are
   logged once: over an interrupted and resumed run each task is consumed, and appears in
   ``staleness.jsonl``, as often as in an uninterrupted run; one line goes to ``resumes.jsonl``.

Without a checkpoint, a run that logged no update yet starts at version 0 (said in the log and in
``resumes.jsonl``); one that did (killed before its first checkpoint, or its checkpoints removed) is
refused: never a silent fresh start. Not restored: the engine's sampling generator restarts from ``run.seed``;
TensorBoard events of the redone updates stay (``metrics.jsonl`` is the record).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentenv.errors import AgentEnvError, CheckpointError, RunFolderError
from agentenv.trainer.checkpoint import (
    CheckpointManager,
    discard_unpublished,
    latest_checkpoint,
    list_checkpoints,
    read_meta,
)
from agentenv.trainer.learners.contract import PolicyLearner

logger = logging.getLogger(__name__)

__all__ = ["LOGS", "RUN_STATE_FORMAT", "Resumed", "check_before_loading", "check_resumable", "checked_run_state",
           "ensure_run_id", "records_updates", "resume",
           "run_identity", "run_state"]

RUN_STATE_FORMAT = 2
"""Layout of a checkpoint's run state. 1 (no ``format`` key): pool, ``next_seed`` and identity only;
2 adds the tasks in flight, the log lengths and the resume counts."""

LOGS = ("metrics.jsonl", "staleness.jsonl", "decisions.jsonl")
"""The run folder's logs that a resume cuts back to the checkpoint."""


@dataclass
class Resumed:
    """What :func:`resume` restored; a fresh run has ``checkpoint`` None and zero counts.

    Attributes:
        checkpoint: The checkpoint folder resumed from (None: a fresh start).
        version: Its policy version.
        requeued: Seeds of the tasks in flight at the checkpoint, requeued by this resume.
        discarded_lines: Per log, the lines written after the checkpoint and cut off.
        removed: What unfinished saves had left under the checkpoint root, removed.
        count: Resumes of this run so far, this one included.
        requeued_total: In-flight tasks requeued by them.
    """

    checkpoint: Path | None = None
    version: int = 0
    requeued: list[int] = field(default_factory=list)
    discarded_lines: dict[str, int] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    count: int = 0
    requeued_total: int = 0

    def figures(self) -> dict[str, int]:
        """Metrics-row keys: ``resume/count`` and ``resume/requeued_tasks_total``."""
        return {"resume/count": self.count, "resume/requeued_tasks_total": self.requeued_total}


def ensure_run_id(run_dir: Path) -> str:
    """The run folder's id from ``run_dir/run.json``, written there (12 hex digits) when missing."""
    path = run_dir / "run.json"
    if path.is_file():
        try:
            return str(json.loads(path.read_text())["run_id"])
        except (ValueError, KeyError, TypeError) as e:
            raise RunFolderError(f"{path}: cannot read the run id ({e!r})") from e
    run_id = uuid.uuid4().hex[:12]
    path.write_text(json.dumps({"run_id": run_id}) + "\n")
    return run_id


def run_identity(cfg: Any, group_size: int, run_id: str | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: model, env and its kwargs, objective, group size, LoRA, run id.

    ``lora`` is None for full fine-tuning, else the adapters' rank, alpha and targets (their tensors'
    shapes and the update's scale).
    """
    lora = cfg.learner
    identity = {"model": cfg.model.name or "embedded SmolLM2-135M-Instruct", "env": cfg.env.id,
                "env_kwargs": json.loads(json.dumps(dict(cfg.env.kwargs))), "objective": cfg.objective.name,
                "group_size": group_size,
                "lora": {"rank": lora.lora_rank, "alpha": lora.lora_alpha, "targets": list(lora.lora_target_modules)}
                if lora.lora_rank else None}
    if run_id is not None:
        identity["run_id"] = run_id
    return identity


def check_resumable(path: Path | None, extra: dict[str, Any], identity: dict[str, Any]) -> None:
    """Refuse a checkpoint written by another run, or by a run of another model, env, objective or group size.

    Only the fields the checkpoint recorded are compared (older checkpoints record fewer; the others
    are named in a warning); a checkpoint without an identity is accepted with a warning.

    Raises:
        RunFolderError: A recorded field differs; names the checkpoint and each differing field.
    """
    saved = extra.get("identity")
    if saved is None:
        logger.warning("%s records no run identity (an older checkpoint): resuming without checking it", path)
        return
    saved = {"lora": None, **saved}  # a checkpoint that records no LoRA trained every weight
    unchecked = sorted(k for k in identity if k not in saved)
    if unchecked:
        logger.warning("%s does not record %s (an older checkpoint): not checked", path, ", ".join(unchecked))
    diff = {k: (saved[k], v) for k, v in identity.items() if k in saved and saved[k] != v}
    if diff:
        said = ", ".join(f"{k} {a!r} (this run: {b!r})" for k, (a, b) in diff.items())
        hint = " (the run id is in run.json)" if "run_id" in diff else ""
        raise RunFolderError(f"{path}: written by another run: {said}{hint}; resume it with its own config "
                             "or start a new run folder")


def checked_run_state(root: Path, path: Path, identity: dict[str, Any]) -> dict[str, Any]:
    """The run state of checkpoint ``path`` (under ``root``), once it is readable and this run's.

    Reads ``meta.json`` only, so it can run before the model loads (:func:`check_before_loading`).

    Raises:
        CheckpointError: ``meta.json`` is missing, truncated or corrupt (the message names the other
            checkpoints, and how to resume from one).
        RunFolderError: The state is not a run state of a format this agentenv reads, or the checkpoint
            belongs to another run or config (:func:`check_resumable`).
    """
    try:
        extra = read_meta(path)["extra"]
    except CheckpointError as exc:
        raise _unreadable(exc, root, path) from exc
    where = path / "meta.json"
    if not isinstance(extra, dict):
        raise RunFolderError(f"{where}: holds no run state (its extra is {type(extra).__name__})")
    fmt = extra.get("format", 1)
    if not isinstance(fmt, int) or not 1 <= fmt <= RUN_STATE_FORMAT:
        raise RunFolderError(f"{where}: run state format {fmt!r}, this agentenv reads formats 1 to "
                             f"{RUN_STATE_FORMAT}; resume it with the agentenv that wrote it")
    check_resumable(path, extra, identity)
    return extra


def check_before_loading(run_dir: Path, identity: dict[str, Any]) -> None:
    """Refuse ``--resume`` of a checkpoint this run cannot continue before the model (and its warm-up) loads.

    The latest checkpoint's ``meta.json`` is checked as :func:`resume` checks it (another model, env,
    objective, group size, LoRA or run id); a folder without a checkpoint passes (:func:`resume`
    decides what that means).

    Raises:
        CheckpointError, RunFolderError: As :func:`checked_run_state`.
    """
    root = run_dir / "checkpoints"
    path = latest_checkpoint(root) if root.is_dir() else None
    if path is not None:
        checked_run_state(root, path, identity)


def run_state(pool: Any, collector: Any, identity: dict[str, Any], run_dir: Path, resumed: Resumed) -> dict[str, Any]:
    """The checkpoint's ``extra``: pool, task stream, log lengths, identity, resume counts (call on the loop).

    ``next_seed`` is kept at the top level as well, where format 1 had it.
    """
    tasks = collector.state_dict()
    return {"format": RUN_STATE_FORMAT, "pool": pool.state_dict(), "collector": tasks,
            "next_seed": tasks["next_seed"], "identity": identity, "logs": _log_sizes(run_dir),
            "resumes": {"count": resumed.count, "requeued_tasks": resumed.requeued_total}}


def resume(run_dir: Path, checkpoints: CheckpointManager, learner: PolicyLearner, pool: Any, collector: Any,
           identity: dict[str, Any]) -> Resumed:
    """Restore a run from its latest checkpoint (the module docstring says what, in which order).

    Args:
        run_dir: The run folder (its logs are cut back to the checkpoint).
        checkpoints: The run's checkpoint root.
        learner: Restored in place (``version`` included).
        pool: Its contents replaced by the checkpoint's.
        collector: Its task stream continued (call before starting it).
        identity: This run's :func:`run_identity`.

    Returns:
        What was restored; ``checkpoint`` None when the root holds none and no update was logged.

    Raises:
        CheckpointError: ``latest`` names a missing folder, or the checkpoint is truncated or corrupt
            (the message names the file and the other checkpoints, and how to resume from one).
        RunFolderError: The checkpoint belongs to another run or config, or holds a run state or pool
            state this agentenv cannot read (the message names its ``meta.json``); or there is no
            checkpoint but ``metrics.jsonl`` records updates.
    """
    root = checkpoints.root
    path = latest_checkpoint(root)
    if path is None:
        if records_updates(run_dir):
            raise RunFolderError(f"--resume: {root} holds no checkpoint, but {run_dir / 'metrics.jsonl'} records "
                                 "updates (killed before its first checkpoint, or the checkpoints were removed): "
                                 "nothing to resume from; start the run again with --overwrite")
        done = Resumed(removed=discard_unpublished(root), count=1,
                       discarded_lines=_cut_logs(run_dir, dict.fromkeys(LOGS, 0)))
        logger.info("no checkpoint under %s yet (stopped before the first update): starting at policy version 0%s",
                    root, _said(done))
        _record(run_dir, done)
        return done
    extra = checked_run_state(root, path, identity)
    where, fmt = path / "meta.json", extra.get("format", 1)
    try:
        pool.load_state_dict(extra["pool"])
    except (KeyError, AgentEnvError) as exc:
        raise RunFolderError(f"{where}: its pool state cannot be read ({exc}); resume from another checkpoint "
                             "or start a new run folder") from exc
    try:
        checkpoints.load_latest(learner)
    except CheckpointError as exc:
        raise _unreadable(exc, root, path) from exc
    tasks = extra.get("collector") or {"next_seed": extra["next_seed"]}
    try:
        requeued = collector.load_state_dict(tasks)
    except AgentEnvError as exc:
        raise RunFolderError(f"{where}: its task state cannot be read ({exc})") from exc
    if fmt == 1:
        logger.warning("%s is an older checkpoint (run state format 1): the tasks in flight when it was written "
                       "were not recorded and are not replayed; the logs are kept as they are", path)
    before = extra.get("resumes", {})
    done = Resumed(checkpoint=path, version=learner.version, requeued=requeued,
                   discarded_lines=_cut_logs(run_dir, extra.get("logs")), removed=discard_unpublished(root),
                   count=int(before.get("count", 0)) + 1,
                   requeued_total=int(before.get("requeued_tasks", 0)) + len(requeued))
    logger.info("resumed at policy version %d from %s: %d tasks in flight requeued%s", done.version, path.name,
                len(requeued), _said(done))
    _record(run_dir, done)
    return done


# -- helpers ---------------------------------------------------------------------------------------
def records_updates(run_dir: Path) -> bool:
    """True when ``run_dir/metrics.jsonl`` holds a line (an update was logged)."""
    logged = run_dir / "metrics.jsonl"
    return logged.is_file() and logged.stat().st_size > 0


def _log_sizes(run_dir: Path) -> dict[str, int]:
    return {name: (run_dir / name).stat().st_size if (run_dir / name).is_file() else 0 for name in LOGS}


def _cut_logs(run_dir: Path, sizes: dict[str, int] | None) -> dict[str, int]:
    """Truncate each log to its recorded length; return the lines cut off (a shorter log is left alone)."""
    cut: dict[str, int] = {}
    for name, size in (sizes or {}).items():
        f = run_dir / name
        if not f.is_file():
            continue
        now = f.stat().st_size
        if now < size:
            logger.warning("%s holds %d bytes, fewer than the %d the checkpoint recorded: left as it is", f, now,
                           size)
        elif now > size:
            with open(f, "rb") as fh:
                fh.seek(size)
                cut[name] = fh.read().count(b"\n")
            os.truncate(f, size)
    return cut


def _unreadable(exc: CheckpointError, root: Path, path: Path) -> CheckpointError:
    msg = str(exc)
    if "other checkpoints" not in msg:
        msg += f"; other checkpoints: {[p.name for p in list_checkpoints(root) if p != path]}"
    return CheckpointError(f"{msg}. To resume from an older checkpoint instead, write its name into {root / 'latest'}")


def _said(done: Resumed) -> str:
    parts = [f"{n} lines of {name}" for name, n in done.discarded_lines.items() if n]
    out = f"; cut {', '.join(parts)} written after it" if parts else ""
    return out + (f"; removed unfinished saves {done.removed}" if done.removed else "")


def _record(run_dir: Path, done: Resumed) -> None:
    rec = {"time": time.time(), "checkpoint": done.checkpoint.name if done.checkpoint else None,
           "version": done.version, "requeued_tasks": done.requeued, "discarded_lines": done.discarded_lines,
           "removed": done.removed, "count": done.count, "requeued_total": done.requeued_total}
    with open(run_dir / "resumes.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")
