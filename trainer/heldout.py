"""Held-out evaluation inside a training run: the policy's success rate on tasks it never trains on.

``agentenv train`` evaluates the policy once before the first update and once after the last one,
with the same engine, budgets and chat template as the rollouts, so the two figures differ only by
the training in between. The held-out tasks are fixed: the first ``eval.problems`` of
``env.tasks()`` of the held-out environment (``make(env.id, **{**env.kwargs, **env.eval_kwargs})``),
each played with ``reset(options={"task": i})``, decoded greedily by default.
Episodes run concurrently through :func:`agentenv.evaluation.run_jobs`, so one failing episode
costs only itself (it counts as a failure and is reported in ``errors``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from agentenv.core import Env, TaskSet
from agentenv.evaluation import EpisodeJob, EpisodeResult, env_tasks, make_jobs, run_jobs
from agentenv.rollout.episode import run_episode
from agentenv.trainer.config import TrainConfig

if TYPE_CHECKING:
    from agentenv.engines.base import GenerationEngine
    from agentenv.rollout.chat import ChatRenderer


@dataclass(frozen=True)
class HeldOutReport:
    """Success of one policy version on the held-out tasks.

    Attributes:
        label: ``"before"`` (policy version 0, after any warm-up) or ``"after"`` (the last version).
        version: Policy version evaluated.
        tasks: Held-out tasks (problems or games).
        episodes: Episodes played (``tasks * samples_per_task``).
        success_rate: Fraction of episodes with a positive reward (a correct boxed answer; a won game).
        tool_calls_mean: Tool calls per episode (python_tool; 0 for envs that do not count them).
        turns_mean: Assistant turns per episode.
        errors: Episodes that ended with an engine or environment error (counted as failures).
        seconds: Wall-clock time of the evaluation (seconds).
        task_ids: ``(tasks,)`` the held-out tasks' ids, in order.
        outcomes: ``(tasks,)`` each task's success rate over its samples (1.0/0.0 with one sample), in
            ``task_ids`` order: two reports of the same run pair up task by task
            (:func:`agentenv.trainer.experiments.significance.paired_bootstrap`).
    """

    label: str
    version: int
    tasks: int
    episodes: int
    success_rate: float
    tool_calls_mean: float
    turns_mean: float
    errors: int
    seconds: float
    task_ids: tuple[str, ...] = ()
    outcomes: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON."""
        return asdict(self)


async def held_out_tasks(cfg: TrainConfig, renderer: ChatRenderer | None = None) -> tuple[Callable[[], Env], TaskSet]:
    """The held-out environment builder and its first ``cfg.eval.problems`` tasks.

    With ``renderer``, constructor arguments the trainer fills from the model (the template's
    ``tool_parser``: :func:`agentenv.trainer.setup.default_env_kwargs`) come first, as in training.

    Returns:
        ``(env_factory, tasks)``: ``env_factory()`` is ``make(env.id, **{**env.kwargs, **env.eval_kwargs})``;
        ``env.reset(options={"task": i})`` plays ``tasks.ids[i]``.

    Raises:
        ConfigError: The env declares no tasks (``tasks()`` is None: set ``eval.problems=0``) or an
            empty list, or a constructor argument is wrong (the message lists the ones it takes).
        DataError: The held-out data cannot be read.
    """
    remedy = f"eval.problems={cfg.eval.problems} has no held-out tasks to play; set eval.problems=0"
    from agentenv.trainer.setup import default_env_kwargs

    kwargs: dict[str, Any] = {**default_env_kwargs(cfg, renderer), **cfg.env.kwargs, **cfg.env.eval_kwargs}
    if cfg.env.remote is not None:  # the held-out episodes play on the same servers
        kwargs["remote"] = cfg.env.remote
    factory, tasks, _ = await env_tasks(cfg.env.id, kwargs, remedy=remedy)
    return factory, tasks.first(cfg.eval.problems)


async def evaluate_held_out(cfg: TrainConfig, engine: GenerationEngine, renderer: ChatRenderer, *, label: str,
                            samples_per_task: int = 1) -> HeldOutReport:
    """Play every held-out task ``samples_per_task`` times with the engine's current weights.

    Args:
        cfg: The run's config (``eval``, ``env`` and ``rollout`` sections are used; the rollout budgets
            are those of training, the temperature is ``eval.temperature``).
        engine: The run's generation engine (its ``version`` is the version evaluated).
        renderer: The chat renderer of the engine's tokenizer.
        label: ``"before"`` or ``"after"``.
        samples_per_task: Episodes per task (success is averaged over them; training plays one, > 1
            makes sense with ``eval.temperature`` > 0).

    Raises:
        ConfigError / DataError: See :func:`held_out_tasks`.
    """
    factory, tasks = await held_out_tasks(cfg, renderer)
    rollout = replace(cfg.rollout, temperature=cfg.eval.temperature)
    jobs = make_jobs(list(zip(tasks.ids, tasks.kinds, strict=True)), samples_per_game=samples_per_task,
                     seed=cfg.run.seed)
    extras: dict[int, tuple[float, float]] = {}

    async def agent(env: Env, job: EpisodeJob) -> EpisodeResult:
        start = time.perf_counter()
        traj = await run_episode(env, engine, renderer, rollout, seed=job.seed, options={"task": job.game_index},
                                 sampling_seed=job.seed if rollout.temperature > 0 else None)
        extras[job.seed] = (float(traj.info.get("tool_calls") or 0), float(traj.info.get("turns", 0)))
        failed = traj.status == "error"
        return EpisodeResult(job.game, job.task_type, job.sample, won=not failed and traj.reward > 0,
                             reward=traj.reward, steps=int(traj.info.get("turns", 0)),
                             seconds=time.perf_counter() - start,
                             error=traj.info.get("error") if failed else None, ending="error" if failed else "")

    t0 = time.perf_counter()
    results = await run_jobs(jobs, agent, factory, concurrency=cfg.eval.concurrency, progress=True)
    per_task: dict[int, list[float]] = {}
    for job, r in zip(jobs, results, strict=True):
        per_task.setdefault(job.game_index, []).append(float(r.won))
    outcomes = tuple(statistics.fmean(per_task[i]) for i in range(len(tasks)) if i in per_task)
    calls = [c for c, _ in extras.values()] or [0.0]
    turns = [t for _, t in extras.values()] or [0.0]
    return HeldOutReport(
        label=label,
        version=engine.version,
        tasks=len(tasks),
        episodes=len(results),
        success_rate=sum(r.won for r in results) / len(results),
        tool_calls_mean=statistics.fmean(calls),
        turns_mean=statistics.fmean(turns),
        errors=sum(r.error is not None for r in results),
        seconds=time.perf_counter() - t0,
        task_ids=tasks.ids,
        outcomes=outcomes,
    )
