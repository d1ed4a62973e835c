"""Sharing between the settings of ``agentenv study``: what need not be run twice.

Two things are reused, only when they are the same experiment, found in the study folders that sit
side by side (``--run-dir``'s parent, ``runs/study/`` by default):

- **A finished setting.** Several studies compare against the same arm (the recipe's default:
  ``flash_reinforce_n1``, ``full_baseline``, ``sample_mean`` and ``no_filter`` are one config). A
  setting whose whole config (all but ``run.run_dir``) and budget equal those of a finished setting
  is that run, copied (its logs and held-out reports, not its checkpoints): one run shown in both
  tables, not two samples.
- **The "before" held-out evaluation.** It evaluates the policy the updates start from, which only
  the model, warm-up, rollout budgets, environment, evaluation and seed decide (:func:`before_key`);
  the study's settings differ in what comes after (``optim``, ``staleness``, ``run`` budgets).
  The warm-up is deterministic and the evaluation greedy (``eval.temperature=0``), so a setting that
  shares it gets the figure it would have measured, and saves the evaluation's minutes.

``agentenv study --no-share`` runs everything afresh.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from agentenv import __version__
from agentenv.configio import load_config, read_yaml, to_dict
from agentenv.errors import AgentEnvError
from agentenv.trainer.config import TrainConfig

__all__ = ["before_key", "copy_finished", "find_before", "find_finished", "has_before", "setting_key"]

MARKER = "study_setting.json"
#: Config sections that decide the policy the updates start from and how it is evaluated.
BEFORE_SECTIONS = ("model", "warmup", "rollout", "env", "eval", "learner")


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def setting_key(cfg: TrainConfig, seconds: float | None) -> str:
    """Fingerprint of one setting: its whole config but ``run.run_dir``, its wall-clock budget, agentenv's version."""
    data = to_dict(cfg)
    data["run"] = {k: v for k, v in data["run"].items() if k != "run_dir"}
    return _digest({"config": data, "seconds": seconds, "agentenv": __version__})


def before_key(cfg: TrainConfig) -> str:
    """Fingerprint of the "before" held-out evaluation.

    It covers :data:`BEFORE_SECTIONS`, ``run.seed`` when the evaluation samples (``eval.temperature``
    > 0: the seed then picks the episodes' tokens) and agentenv's version. A greedy evaluation of the
    warm-up's policy (whose seed is fixed, :data:`agentenv.trainer.warmup.WARMUP_SEED`) is the same
    for every run seed, so the seeds of a study share it. ``env.step_latency`` is left out (it delays
    training steps only).
    """
    data = to_dict(cfg)
    sections = {k: data[k] for k in BEFORE_SECTIONS}
    sections["env"] = {k: v for k, v in sections["env"].items() if k != "step_latency"}
    seed = cfg.run.seed if cfg.eval.temperature > 0 else None
    return _digest({"sections": sections, "seed": seed, "agentenv": __version__})


def _study_runs(parent: Path, name: str) -> list[Path]:
    """Run folders ``parent/<study>/<setting>`` and ``parent/<study>/<setting>/seed<k>`` holding ``name``.

    In a stable order (sorted).
    """
    return sorted(p.parent for pattern in (f"*/*/{name}", f"*/*/seed*/{name}") for p in parent.glob(pattern))


def find_finished(parent: Path, key: str, *, exclude: Path) -> Path | None:
    """A finished setting under ``parent`` whose :func:`setting_key` is ``key`` (not ``exclude``), or None."""
    for run in _study_runs(parent, MARKER):
        try:
            marker = json.loads((run / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if run.resolve() != exclude.resolve() and marker.get("finished") and marker.get("key") == key:
            return run
    return None


def find_before(parent: Path, cfg: TrainConfig, *, exclude: Path) -> Path | None:
    """A run folder under ``parent`` with an ``eval_before.json`` of the same :func:`before_key` as ``cfg``, or None.

    A candidate whose config or report cannot be read (a run killed while writing) is passed over.
    """
    key = before_key(cfg)
    for run in _study_runs(parent, "eval_before.json"):
        if run.resolve() != exclude.resolve() and has_before(run, key):
            return run
    return None


def has_before(run: Path, key: str) -> bool:
    """True when ``run``'s ``eval_before.json`` reads and its ``config.yaml`` has :func:`before_key` ``key``.

    A run whose config or report cannot be read (killed while writing) has none.
    """
    try:
        json.loads((run / "eval_before.json").read_text())
        held = load_config(TrainConfig, read_yaml(run / "config.yaml"))
    except (OSError, ValueError, AgentEnvError):
        return False
    return before_key(held) == key


def copy_finished(src: Path, dst: Path) -> None:
    """Copy a finished setting's folder (logs, held-out reports, plots; not ``checkpoints/``) to ``dst``."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("checkpoints"))
