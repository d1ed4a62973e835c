"""The training loop: rollout, select, update, sync, log, on parts built by :class:`LoopParts`.

:func:`train` runs one run of ``agentenv train`` (:mod:`agentenv.trainer.recipe` is its command
line). In the order it runs:

1. checks: the environment id and arguments, the warm-up, the held-out tasks (seconds, before the model);
2. model: the policy and the generation engine (which decodes the learner's own parameters when it
   runs in the learner's process, :func:`serve_policy`), the trajectory pool and the collector;
   ``--resume`` restores them (:mod:`agentenv.trainer.resume`); the held-out evaluation before training;
3. rollout: the collector plays ``run.concurrency`` episodes at a time into the pool (``async``: all
   the time; ``sync``: B episodes, then it waits for the update);
4. update: the pool hands over a batch of B chosen by the staleness policy (PACE by default); the
   learner takes exactly one step; the version increments; the new weights reach the engine (a copy, or
   in place at the next decoding step), interrupting in-flight generation, which continues from its prefix;
5. logging: a metrics row per consumed batch, per-trajectory staleness, every decision of the
   staleness policy, checkpoints; after the loop, the held-out evaluation, plots and the summary.

The algorithm is :func:`_train`'s loop; what experiments measure or force around it (busy clocks, a
forced lag, a wall-clock budget, the entropy probe, fault counters) is :class:`Instruments`, one call
per hook. Tests and experiments pass their own parts (:class:`LoopParts`) instead of patching modules.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
import yaml

from agentenv.configio import to_dict
from agentenv.engines.base import GenerationEngine
from agentenv.engines.busy import BusyClock, BusyTrackingEngine
from agentenv.engines.supervised import SupervisedEngine
from agentenv.faults import FAULTS
from agentenv.malloc import HeapTrimmer
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.collector import RolloutCollector
from agentenv.rollout.pool import BatchSelection, TrajectoryPool, rejection_by_length
from agentenv.trainer import setup
from agentenv.trainer.batch_wait import failure_limit, next_batch
from agentenv.trainer.checkpoint import CheckpointManager
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.heldout import evaluate_held_out, held_out_tasks
from agentenv.trainer.instruments import Instruments
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trainer.learners.update_step import UpdateStats
from agentenv.trainer.metrics import MetricsWriter
from agentenv.trainer.overlap import overlap, timed_env_factory
from agentenv.trainer.pause import pause_point
from agentenv.trainer.plots import plot_run
from agentenv.trainer.resume import Resumed, check_before_loading, ensure_run_id, run_identity, run_state
from agentenv.trainer.resume import resume as resume_run
from agentenv.trainer.setup import LoopParts
from agentenv.trainer.sync_check import SyncCheck
from agentenv.trajectory import Trajectory

__all__ = ["held_out", "serve_policy", "train"]

logger = logging.getLogger("agentenv.train")


async def train(cfg: TrainConfig, run_dir: Path, *, resume: bool = False, stop: asyncio.Event | None = None,
                loop_seconds: float | None = None, parts: LoopParts | None = None) -> dict[str, Any]:
    """Train for ``cfg.run.updates`` updates and return the final summary (also written to ``summary.json``).

    Args:
        cfg: The whole run's config.
        run_dir: The run folder (:func:`agentenv.trainer.recipe.prepare_run_dir` made it).
        resume: Continue from the folder's latest checkpoint (:mod:`agentenv.trainer.resume`).
        stop: Set to interrupt (Ctrl-C): the update at hand finishes, a checkpoint is written, the
            held-out evaluation after training is skipped (or cancelled), ``interrupted`` is True.
        loop_seconds: A budget for the update loop (seconds from the loop's start, collector start
            included; model load, warm-up and the "before" evaluation are outside it; <= 0: no
            batch at all), as ``agentenv study``'s equal wall-clock uses: when it is spent the loop
            ends after the update at hand, and the run is complete (evaluated after training;
            ``budget_spent`` True, ``interrupted`` False).
        parts: How the policy, environments, learner and engine are built (:class:`LoopParts`);
            None: from the config, as ``agentenv train`` does.

    Raises:
        AgentEnvError: The environment, model or run folder is unusable, or episodes keep failing
            (:func:`agentenv.trainer.batch_wait.failure_limit`).
        Interrupted: ``stop`` was set during the warm-up.
    """
    stop = stop or asyncio.Event()
    halt = asyncio.Event()  # ends the update loop: a stop or a spent budget
    watcher = asyncio.ensure_future(_set_when(stop, halt))
    try:
        with HeapTrimmer():  # freed heap pages leave the process every half second (agentenv.malloc)
            return await _train(cfg, run_dir, parts or LoopParts(), resume=resume, stop=stop, halt=halt,
                                loop_seconds=loop_seconds)
    finally:
        watcher.cancel()


async def _set_when(event: asyncio.Event, target: asyncio.Event) -> None:
    await event.wait()
    target.set()


def rollouts_per_task(cfg: TrainConfig) -> int:
    """Rollouts per task: GRPO's group size, 1 for FlashREINFORCE (one rollout per prompt)."""
    return cfg.objective.grpo_group_size if cfg.objective.name == "grpo" else 1


@dataclass
class _Run:
    """The parts one run's loop works on (built by :func:`_open`) and its progress."""

    cfg: TrainConfig
    run_dir: Path
    learner: PolicyLearner
    engine: BusyTrackingEngine
    renderer: ChatRenderer
    pool: TrajectoryPool
    collector: RolloutCollector
    checkpoints: CheckpointManager
    instruments: Instruments
    learner_lock: asyncio.Lock
    identity: dict[str, Any]
    in_place: bool = False  # the engine decodes the learner's own parameters: no weights are copied
    resumed: Resumed = field(default_factory=Resumed)
    sync_check: SyncCheck | None = None  # the engine samples the version it claims (trainer/sync_check.py)
    sync_gap: float | None = None  # the latest probe gap (nats per token)
    sync: dict[str, float] = field(default_factory=dict)  # the latest weight sync: sync/bytes, sync/seconds
    saved_version: int = 0  # the version of the latest checkpoint
    batches: int = 0  # consumed, with or without an optimizer step

    @property
    def group_size(self) -> int:
        """Rollouts per task."""
        return rollouts_per_task(self.cfg)

    def state(self) -> dict[str, Any]:
        """The pool, the task stream and the tasks in flight for a checkpoint (take it on the event loop)."""
        return run_state(self.pool, self.collector, self.identity, self.run_dir, self.resumed)

    def save(self, state: dict[str, Any]) -> None:
        """A checkpoint of the learner with ``state`` (:meth:`state`); may run in a worker thread."""
        self.checkpoints.save(self.learner, extra=state)
        self.saved_version = self.learner.version


@dataclass
class _Logs:
    """The loop's per-update logs: metrics rows, per-trajectory staleness, the staleness policy's decisions."""

    metrics: MetricsWriter
    staleness: IO[str]
    decisions: IO[str]
    rejected_now: list[Trajectory] = field(default_factory=list)  # rejected while waiting for this batch

    def close(self) -> None:
        self.staleness.close()
        self.decisions.close()


async def _train(cfg: TrainConfig, run_dir: Path, parts: LoopParts, *, resume: bool, stop: asyncio.Event,
                 halt: asyncio.Event, loop_seconds: float | None) -> dict[str, Any]:
    """:func:`train`'s body: ``halt`` ends the update loop, ``stop`` also skips the evaluation after it."""
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    t_start = time.time()
    await _check(cfg, parts, run_dir, resume)                                   # 1. checks
    run = await _open(cfg, run_dir, parts, resume, stop, halt, loop_seconds)   # 2. model, engine, pool
    saved_at_start = run.learner.version
    if cfg.eval.problems and not (run_dir / "eval_before.json").exists():
        await held_out(cfg, run.engine, run.renderer, run_dir, "before", stop)

    logs = _Logs(MetricsWriter(run_dir), (run_dir / "staleness.jsonl").open("a"),
                 (run_dir / "decisions.jsonl").open("a"))
    summary: dict[str, Any] = {}
    t_loop = time.time()
    run.instruments.start_loop()
    # under a time budget the updates are as many as fit: the bar counts them without an end
    progress = setup.progress_bar(total=cfg.run.updates if loop_seconds is None else None,
                                  initial=run.learner.version)
    try:
        if cfg.staleness.policy != "sync":  # sync: each batch is collected after the previous update
            await run.collector.start()
        while run.learner.version < cfg.run.updates and not halt.is_set():
            if run.batches >= cfg.run.batch_limit:
                logger.warning("stopping after %d batches: only %d of them carried gradient (run.max_batches)",
                               run.batches, run.learner.version - saved_at_start)
                break
            t_wait = time.time()
            selection = await _rollout(run, logs, halt)                         # 3. rollout and selection
            if selection is None:
                break
            wait_s, t_update, consumed_at = time.time() - t_wait, time.time(), run.learner.version
            stats = await _update(run, selection)                               # 4. one step, weights to the engine
            update_s = time.time() - t_update
            await _check_sync(run, selection, stats)                            #    it samples what it claims
            run.batches += 1
            summary = _log(run, logs, selection, stats, consumed_at, wait_s, update_s, t_start)  # 5. logging
            progress.set_postfix(setup.postfix(summary), refresh=False)
            progress.update(int(stats.stepped))
            if stats.stepped and run.learner.version % cfg.run.checkpoint_every == 0:
                await asyncio.to_thread(run.save, run.state())  # the state taken on the loop, written in a thread
    finally:
        loop_busy = run.instruments.end_loop()
        progress.close()
        logs.close()
        await run.collector.close()
        train_s = time.time() - t_loop
        after = await _close(run, stop, saved_at_start)
        if after is not None:
            summary["eval/after"] = after
        logs.metrics.close()
        await asyncio.to_thread(plot_run, run_dir)
    summary.update(_held_out_summary(run_dir))
    summary = {**summary, **overlap(loop_busy["busy/engine_s"], loop_busy["busy/env_s"], loop_busy["busy/learner_s"],
                                    loop_busy["busy/wall_s"]),
               "updates": run.learner.version, "train_s": train_s, "wall_clock_s": time.time() - t_start,
               "peak_rss_gb": setup.peak_rss_gb(), "interrupted": stop.is_set(),
               "budget_spent": run.instruments.spent.is_set()}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


# -- 1. checks ------------------------------------------------------------------------------------
async def _check(cfg: TrainConfig, parts: LoopParts, run_dir: Path, resume: bool) -> None:
    """The environment and the checkpoint to resume before the model, so that a wrong setting fails in seconds.

    A wrong id or constructor argument (env.kwargs, env.eval_kwargs), a warm-up or held-out evaluation
    the env cannot serve; with ``resume``, a checkpoint of another run or config (model, env, objective,
    group size, LoRA), refused before the model and its warm-up load.
    """
    parts.env_factory(cfg)  # checks the id and the constructor arguments; built for real in _open, with the renderer
    setup.check_warmup(cfg)
    if cfg.eval.problems:
        await held_out_tasks(cfg)
    if resume:
        check_before_loading(run_dir, run_identity(cfg, rollouts_per_task(cfg), ensure_run_id(run_dir)))


# -- 2. model, engine, pool, collector; resume -----------------------------------------------------
async def _open(cfg: TrainConfig, run_dir: Path, parts: LoopParts, resume: bool, stop: asyncio.Event,
                halt: asyncio.Event, loop_seconds: float | None) -> _Run:
    """Load the policy (after its cached warm-up; Ctrl-C stops it between steps) and build the loop's parts.

    The engine is supervised: one that dies is rebuilt from the learner's latest weights
    (:mod:`agentenv.engines.supervised`), under the learner lock so that a rebuild never reads weights
    while the learner steps. With ``resume`` the learner, the pool and the tasks in flight come back from
    the latest checkpoint and the logs are cut back to it. Writes ``config.yaml`` (a refused resume keeps it).
    """
    model, tokenizer, renderer = await asyncio.to_thread(parts.load_policy, cfg, should_stop=stop.is_set)
    env_factory = parts.env_factory(cfg, renderer)  # an env taking tool_parser gets the template's (unless set)
    learner = parts.build_learner(cfg, model)
    learner_lock = asyncio.Lock()
    instruments = Instruments(cfg, BusyClock(), halt, loop_seconds)  # the engine's busy clock is theirs

    async def rebuild_engine(dead: GenerationEngine) -> GenerationEngine:
        async with learner_lock:  # under a forced lag the rebuilt engine serves the lagged weights
            return await parts.rebuild_engine(dead, instruments.engine_source(learner),
                                              lambda m: parts.build_engine(cfg, m, tokenizer))

    FAULTS.reset()  # faults/* count from this run's start
    served, in_place = serve_policy(cfg, parts, learner, model, tokenizer)
    engine = BusyTrackingEngine(SupervisedEngine(served, rebuild_engine), instruments.busy.engine)
    group_size = rollouts_per_task(cfg)
    pool = TrajectoryPool(cfg.staleness, group_size=group_size)
    collector = RolloutCollector(
        timed_env_factory(env_factory, instruments.busy.env),
        engine,
        renderer,
        cfg.rollout,
        None,
        on_group=pool.add_group,
        concurrency=cfg.run.concurrency,
        version_fn=lambda: learner.version,
        first_seed=cfg.run.seed * 1_000_003,
        admit=lambda: len(pool) + collector.in_flight < cfg.run.max_pool_size,
        group_size=group_size,
        failure_limit=failure_limit(cfg.run.concurrency),
    )
    run = _Run(cfg, run_dir, learner, engine, renderer, pool, collector, CheckpointManager(run_dir / "checkpoints"),
               instruments, learner_lock, run_identity(cfg, group_size, ensure_run_id(run_dir)), in_place)
    run.sync_check = parts.sync_check(cfg)
    if resume:
        run.resumed = resume_run(run_dir, run.checkpoints, learner, pool, collector, run.identity)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    if learner.version != engine.version:
        await engine.update_weights(learner.weights_for_engine(), learner.version)
    await instruments.start_lag(learner)  # staleness.forced_lag counts from here
    run.saved_version = learner.version
    return run


def serve_policy(cfg: TrainConfig, parts: LoopParts, learner: PolicyLearner, model: torch.nn.Module,
                 tokenizer: Any) -> tuple[GenerationEngine, bool]:
    """The generation engine for ``model``, and whether it decodes the learner's own parameters.

    In place (:mod:`agentenv.engines.shared_weights`) when the single-process learner trains
    ``model`` itself, the engine is the transformers engine and no forced lag holds the engine back
    (``staleness.forced_lag``): the engine is built on a copy of ``model``, then decodes ``model``'s
    own parameters instead (the copy is dropped), and each optimizer step waits for the decoding
    step in progress instead of a copy of the weights following it. Otherwise (vLLM, the DeepSpeed
    or Ray learners, a forced lag, a test's scripted engine) the engine keeps its own copy and each
    new version is copied into it.
    """
    from agentenv.engines.transformers_engine import TransformersEngine
    from agentenv.trainer.learners.single import Learner

    engine = parts.build_engine(cfg, copy.deepcopy(model), tokenizer)
    if not (isinstance(engine, TransformersEngine) and isinstance(learner, Learner) and learner.model is model
            and not cfg.staleness.forced_lag):
        return engine, False
    engine.serve_in_place(model, learner.share_weights())  # the engine's copy is dropped
    logger.info("the engine decodes the learner's parameters in place (one copy of the weights)")
    return engine, True


# -- 3. rollout and selection ---------------------------------------------------------------------
async def _rollout(run: _Run, logs: _Logs, halt: asyncio.Event) -> BatchSelection | None:
    """The next batch of B under the staleness policy (None: the loop was halted while waiting).

    In sync mode exactly the missing trajectories are generated first (whole groups), so nothing
    overlaps with training. A split episode (``rollout.on_prefix_violation=split``) may leave samples
    over B in the pool, so only what is missing is collected. Every selection attempt is logged to
    ``decisions.jsonl``; a rejected trajectory's task is played again.
    """
    cfg, pool, collector = run.cfg, run.pool, run.collector
    logs.rejected_now.clear()

    def on_decision(sel: BatchSelection) -> None:
        logs.rejected_now.extend(sel.rejected)
        for traj in sel.rejected:
            collector.requeue(traj)
        logs.decisions.write(json.dumps(sel.decision.to_dict()) + "\n")

    missing = cfg.run.batch_size - len(pool)
    if cfg.staleness.policy == "sync" and missing > 0:
        n = run.group_size
        trajs = await collector.collect(-(-missing // n) * n)
        for i in range(0, len(trajs), n):
            pool.add_group(trajs[i : i + n])
    selection = await next_batch(pool, run.learner, cfg, halt, on_decision, collector, run.instruments.busy.learner)
    logs.decisions.flush()
    return selection


# -- 4. update and weight sync --------------------------------------------------------------------
async def _update(run: _Run, selection: BatchSelection) -> UpdateStats:
    """One optimizer step on the batch, then the new weights to the engine (in place: nothing to copy).

    ``run.sync`` gets the step's ``sync/bytes`` (the tensors the engine received: the adapters alone
    for LoRA, 0 in place or while a forced lag holds the version back) and ``sync/seconds`` (the
    weights' copy out of the learner and into the engine, wall clock).

    A batch without gradient takes no step (the version stays, the engine keeps its weights, so the
    next batch is gated at the same lag); it is discarded all the same. The learner counts as busy until
    the engine holds the new weights; the step's freed activations leave the process at the next
    trim (:class:`~agentenv.malloc.HeapTrimmer`, around the whole run).
    """
    learner, engine = run.learner, run.engine
    with run.instruments.busy.learner.running():
        async with run.learner_lock:
            stats = await asyncio.to_thread(_step, learner, selection)
        run.sync = {"sync/bytes": 0.0, "sync/seconds": 0.0} if stats.stepped else {}  # in place: nothing moves
        if stats.stepped and not run.in_place:  # the state-dict copy runs in a worker thread too
            start = time.perf_counter()
            weights = await asyncio.to_thread(learner.weights_for_engine)
            due = run.instruments.due(learner.version, weights)  # under a forced lag: k versions ago, or none
            if due is not None:
                await engine.update_weights(due.weights, due.version)
                run.sync["sync/bytes"] = float(weights_bytes(due.weights))
            run.sync["sync/seconds"] = time.perf_counter() - start
            del weights, due  # the engine has copied them in: this copy must not live through the next step
        if stats.stepped:  # in place too: the probe measures the policy, whichever way the engine got it
            await run.instruments.after_step(learner, selection)
    return stats


def weights_bytes(weights: Any) -> int:
    """Bytes of a weight update: its tensors' (a state dict), or the file's (a safetensors path)."""
    if isinstance(weights, (str, Path)):
        return Path(weights).stat().st_size
    return sum(t.numel() * t.element_size() for t in weights.values())


async def _check_sync(run: _Run, selection: BatchSelection, stats: UpdateStats) -> None:
    """After a step: the engine samples the version it now claims (:mod:`agentenv.trainer.sync_check`).

    Raises:
        SamplingMismatch: The weight sync did not take.
    """
    if stats.stepped and run.sync_check is not None:
        run.sync_check.take_prompts(selection.batch)
        run.sync_gap = await run.sync_check.after_sync(run.engine, run.learner, run.learner.version)


def _step(learner: PolicyLearner, selection: BatchSelection) -> UpdateStats:
    """One learner update on the selected batch (in a worker thread), then the ``update`` pause point."""
    stats = learner.update(selection.batch, scores=selection.scores)
    pause_point("update")  # tests: AGENTENV_PAUSE_AT=update:K kills a run here (trainer/pause.py)
    return stats


# -- 5. logging -----------------------------------------------------------------------------------
def _log(run: _Run, logs: _Logs, selection: BatchSelection, stats: UpdateStats, consumed_at: int,
         wait_s: float, update_s: float, t_start: float) -> dict[str, Any]:
    """Write one metrics row (``update`` is the policy version after the batch) and the batch's staleness lines.

    Returns the row.
    """
    row = setup.update_metrics(run.learner.version, selection, stats, run.pool, run.collector, wait_s, update_s,
                               t_start, consumed_at=consumed_at)
    row["pool/rejected"] = len(logs.rejected_now)
    row.update(rejection_by_length(logs.rejected_now, selection.batch, run.cfg.rollout.policy_token_budget))
    row.update(run.instruments.figures())  # probe entropy, busy/* since the loop began, faults/*
    if run.sync_gap is not None:
        row["sync/probe_logprob_gap"] = run.sync_gap
    row.update(run.sync)
    row["train/batches"] = run.batches
    row.update(run.resumed.figures())  # resume/count, resume/requeued_tasks_total (in-flight tasks replayed)
    logs.metrics.log(run.batches, row)
    for traj in selection.batch:  # with the collector's task seed: some envs' task ids repeat across seeds
        record = {**setup.consumed_record(traj, consumed_at), "seed": traj.info.get("seed")}
        logs.staleness.write(json.dumps(record) + "\n")
    logs.staleness.flush()
    return row


# -- after the loop -------------------------------------------------------------------------------
async def _close(run: _Run, stop: asyncio.Event, saved_at_start: int) -> float | None:
    """The final checkpoint, the held-out evaluation after training, the engine closed.

    Evaluated after training when this process trained, or when an earlier process of the run
    trained and was stopped before its evaluation after (resumed with nothing left to train); not
    when ``stop`` is set. Returns the success rate after training, or None when none was measured.
    """
    cfg, learner, engine = run.cfg, run.learner, run.engine
    if learner.version != run.saved_version:
        run.save(run.state())
    unevaluated = learner.version > 0 and not (run.run_dir / "eval_after.json").exists()
    trained = learner.version > saved_at_start or unevaluated
    after = None
    if cfg.eval.problems and not stop.is_set() and trained:
        if engine.version != learner.version:  # a forced lag: the held-out policy is the trained one
            await engine.update_weights(await asyncio.to_thread(learner.weights_for_engine), learner.version)
        after = await held_out(cfg, engine, run.renderer, run.run_dir, "after", stop)
    await engine.close()
    return after


def _held_out_summary(run_dir: Path) -> dict[str, Any]:
    """``eval/before`` and the change after training with its intervals, from the run folder's reports."""
    before, after = run_dir / "eval_before.json", run_dir / "eval_after.json"
    out: dict[str, Any] = {}
    if before.exists():
        out["eval/before"] = json.loads(before.read_text())["success_rate"]
    if before.exists() and after.exists():
        out.update(setup.held_out_change(json.loads(before.read_text()), json.loads(after.read_text())))
    return out


async def held_out(cfg: TrainConfig, engine: GenerationEngine, renderer: ChatRenderer, run_dir: Path, label: str,
                   stop: asyncio.Event) -> float | None:
    """Evaluate the engine's policy on the held-out tasks; write ``eval_<label>.json``; return the success rate.

    Returns None, writing nothing, when ``stop`` is set before the evaluation finishes (it is cancelled).
    """
    evaluation = asyncio.ensure_future(evaluate_held_out(cfg, engine, renderer, label=label))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({evaluation, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not evaluation.done():
        evaluation.cancel()
        await asyncio.gather(evaluation, return_exceptions=True)
        logger.info("held-out evaluation %s training cancelled", label)
        return None
    report = evaluation.result()
    (run_dir / f"eval_{label}.json").write_text(json.dumps(report.to_dict(), indent=2))
    logger.info("held-out success %s training (version %d): %.3f over %d episodes", label, report.version,
                report.success_rate, report.episodes)
    return report.success_rate
