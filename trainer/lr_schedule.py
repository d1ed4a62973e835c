"""The learning-rate schedule of every learner backend, and re-applying optimizer settings on resume.

Schedules (``optim.lr_schedule``), as a factor of the peak ``optim.lr`` at optimizer step ``s``
(0-based: the factor used *by* step ``s``), with ``W`` the warm-up steps and ``N`` the run's
optimizer steps (``run.updates``). ``W`` is ``optim.warmup_steps``, or, with ``optim.warmup_ratio = f``
set instead, ``floor(f * N)`` (:func:`warmup_length`): rounded down, so a run of any length keeps
steps after its warm-up, and a one-update smoke run has none:

* warm-up, ``s < W``: ``(s + 1) / W`` (linear, reaching 1 at the last warm-up step);
* ``"constant"``: 1 after the warm-up;
* ``"cosine"``: after the warm-up, ``r + (1 - r) * (1 + cos(pi * p)) / 2`` with
  ``p = min(1, (s - W + 1) / (N - W))`` and ``r = optim.min_lr_ratio``: the first step after the
  warm-up is already slightly below the peak and step ``N - 1`` (the last) runs at ``r``; steps past
  ``N`` (a resumed run that was extended) stay at ``r``;
* ``"wsd"`` (warm-up, stable, decay): 1 after the warm-up until the last ``D`` steps, which follow
  the same cosine from 1 down to ``r``: ``p = min(1, (s - (N - D) + 1) / D)``. ``D`` is
  ``max(1, floor(optim.decay_ratio * N))`` (:func:`decay_length`). The cosine schedule is the case
  ``D = N - W``; ``"wsd"`` keeps the peak for the middle of the run instead of decaying from its start.

The FlashREINFORCE paper trains with a cosine schedule, a linear warm-up over 3% of the steps and a
floor of 0.1 x the peak (docs/algorithms.md); ``"constant"`` with ``W = 0`` is a plain constant lr.

``torch.optim.Optimizer.load_state_dict`` restores the lr, betas, eps and weight decay saved in the
checkpoint, and ``LambdaLR.load_state_dict`` the saved base lr: a run resumed with new settings would
silently keep the old ones. :func:`apply_optim_settings` writes the config's values back after a
restore.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

from agentenv.errors import ConfigError

__all__ = [
    "SCHEDULES", "apply_optim_settings", "build_scheduler", "decay_length", "log_applied", "lr_factor", "warmup_length",
]

log = logging.getLogger(__name__)

#: The schedule names ``optim.lr_schedule`` accepts.
SCHEDULES = ("constant", "cosine", "wsd")


def lr_factor(step: int, *, schedule: str, warmup_steps: int, total_steps: int | None,
              min_lr_ratio: float, decay_steps: int | None = None) -> float:
    """The factor of the peak lr used by optimizer step ``step`` (0-based); see the module docstring.

    Args:
        step: Optimizer steps taken before this one (>= 0).
        schedule: ``"constant"``, ``"cosine"`` or ``"wsd"``.
        warmup_steps: ``W``, linear warm-up steps (>= 0).
        total_steps: ``N``, the run's optimizer steps; needed by ``"cosine"`` and ``"wsd"``.
        min_lr_ratio: ``r`` in [0, 1], the decay's floor as a fraction of the peak.
        decay_steps: ``D``, the steps of ``"wsd"``'s final decay (>= 1); unused by the others.

    Returns:
        A factor in ``(0, 1]`` (``r`` may make it 0 at the end of a decay).

    Raises:
        ConfigError: An unknown schedule; ``"cosine"`` without ``total_steps > warmup_steps``;
            ``"wsd"`` without ``decay_steps >= 1`` and ``warmup_steps + decay_steps <= total_steps``.
    """
    if schedule not in SCHEDULES:
        raise ConfigError(f"optim.lr_schedule must be one of {', '.join(SCHEDULES)}; got {schedule!r}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    if schedule == "cosine":
        if total_steps is None or total_steps <= warmup_steps:
            raise ConfigError(f"optim.lr_schedule 'cosine' needs the run's optimizer steps ({total_steps}) to "
                              f"exceed optim.warmup_steps ({warmup_steps})")
        decay_steps = total_steps - warmup_steps
    elif total_steps is None or decay_steps is None or decay_steps < 1 or warmup_steps + decay_steps > total_steps:
        raise ConfigError(f"optim.lr_schedule 'wsd' needs a warm-up ({warmup_steps} steps) and a decay "
                          f"({decay_steps} steps) that fit in the run's optimizer steps ({total_steps})")
    progress = min(1.0, max(0.0, (step - (total_steps - decay_steps) + 1) / decay_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_length(config: Any, total_steps: int | None) -> int:
    """``W``, the warm-up in optimizer steps: ``config.warmup_steps``, or ``floor(config.warmup_ratio * N)``.

    Args:
        config: An :class:`OptimConfig` (``warmup_steps`` >= 0; ``warmup_ratio`` in [0, 1); at most
            one of them non-zero, which the config checks).
        total_steps: ``N``, the run's optimizer steps, or None (a run without a horizon).

    Raises:
        ConfigError: ``warmup_ratio`` set for a run without ``total_steps``.
    """
    ratio = float(config.warmup_ratio)
    if ratio == 0.0:
        return int(config.warmup_steps)
    if total_steps is None:
        raise ConfigError(f"optim.warmup_ratio ({ratio}) needs the run's optimizer steps (run.updates)")
    return math.floor(ratio * total_steps + 1e-9)  # 0.2 * 10 is 2, not 1.9999...


def decay_length(config: Any, total_steps: int | None) -> int | None:
    """``D``, the ``"wsd"`` schedule's final decay in optimizer steps: ``max(1, floor(config.decay_ratio * N))``.

    None for a run without ``total_steps`` (the schedule then refuses to build).
    """
    if total_steps is None:
        return None
    return max(1, math.floor(float(config.decay_ratio) * total_steps + 1e-9))


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: Any, total_steps: int | None
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over ``optimizer`` following ``config``'s schedule (an :class:`OptimConfig`).

    Stepped once after every optimizer step; its ``last_epoch`` is then the number of steps taken.

    Raises:
        ConfigError: As :func:`lr_factor` (checked here for step 0 and the last step).
    """
    warmup, decay = warmup_length(config, total_steps), decay_length(config, total_steps)

    def factor(step: int) -> float:
        return lr_factor(step, schedule=config.lr_schedule, warmup_steps=warmup,
                         total_steps=total_steps, min_lr_ratio=config.min_lr_ratio, decay_steps=decay)

    if total_steps is not None or config.lr_schedule != "constant":  # refuse a bad geometry now, not at the last step
        factor(max((total_steps or 0) - 1, warmup))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def apply_optim_settings(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LambdaLR,
                         config: Any) -> dict[str, tuple[Any, Any]]:
    """Write ``config``'s lr, betas, eps and weight decay over what a checkpoint restored.

    The optimizer's moments and step counts and the scheduler's step count are kept; the peak lr
    becomes ``config.lr`` and each group's current lr ``config.lr * factor(last_epoch)``.

    Args:
        optimizer: An AdamW restored from a checkpoint.
        scheduler: Its ``LambdaLR`` (from :func:`build_scheduler`), restored too.
        config: The run's :class:`OptimConfig`.

    Returns:
        ``{field: (restored value, applied value)}`` for every field that differed (empty when the
        checkpoint's settings were the config's), for the caller to log.
    """
    wanted = {"lr": float(config.lr), "betas": tuple(float(b) for b in config.betas),
              "eps": float(config.adam_eps), "weight_decay": float(config.weight_decay)}
    changed: dict[str, tuple[Any, Any]] = {}
    for group in optimizer.param_groups:
        restored = {"lr": float(group.get("initial_lr", group["lr"])), "betas": tuple(group["betas"]),
                    "eps": float(group["eps"]), "weight_decay": float(group["weight_decay"])}
        for key, value in wanted.items():
            if restored[key] != value:
                changed.setdefault(key, (restored[key], value))
        group["initial_lr"] = wanted["lr"]
        group["betas"] = wanted["betas"]
        group["eps"] = wanted["eps"]
        group["weight_decay"] = wanted["weight_decay"]
    scheduler.base_lrs = [wanted["lr"]] * len(optimizer.param_groups)
    step = scheduler.last_epoch
    for group, base, fn in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * fn(step)
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]  # what get_last_lr() reports
    return changed


def log_applied(changed: dict[str, tuple[Any, Any]]) -> None:
    """Warn once per field that a resume replaced the checkpoint's optimizer setting by the config's."""
    for key, (old, new) in changed.items():
        log.warning("resume: optim %s is %s in the config, %s in the checkpoint: using %s", key, new, old, new)
