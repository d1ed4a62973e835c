"""``agentenv train``: asynchronous agentic RL, top to bottom.

Phases, in the order they run:

1. configuration: recipe YAML + command-line overrides -> :class:`TrainConfig`; the run folder.
2. model: the policy (learner copy) and the generation engine (engine copy); an optional cached
   supervised warm-up on the environment's scripted demonstrations (python_tool's tool calls).
3. rollout: a collector plays ``run.concurrency`` episodes at a time into the trajectory pool
   (``async``: all the time; ``sync``: B episodes, then it waits for the update).
4. update: the pool hands over a batch of B chosen by the staleness policy (PACE by default); the
   learner takes exactly one FlashREINFORCE step; the version increments; the new weights reach the
   engine, interrupting in-flight generation, which continues from its prefix.
5. logging: metrics (JSONL + TensorBoard), per-trajectory staleness, checkpoints, plots. Each row
   carries the seconds the engine, the environments and the learner were busy since the loop began
   (``busy/*``); the summary, the overlap bound they allow and the overlap the run achieved
   (``overlap/*``, :mod:`agentenv.trainer.overlap`).

With ``eval.problems > 0`` the policy is evaluated on held-out tasks before the first update and
after the last one (``eval_before.json``, ``eval_after.json``; both success rates in the summary).

Ctrl-C stops cleanly: during the warm-up after its current step (nothing cached), during a held-out
evaluation at once (nothing written), during training after the current update, with a final
checkpoint. ``--resume`` continues with the same versions, from the run folder's saved config with
only the options given on its command line changed (e.g. ``--updates 40`` to train further); after a
``kill -9`` too, at any moment, without losing or repeating a task (what a checkpoint holds and how
the run is put back: :mod:`agentenv.trainer.resume`).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import json
import logging
import random
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml

from agentenv.chat import ChatRenderer
from agentenv.collector import RolloutCollector
from agentenv.configio import apply_overrides, load_config, read_yaml, to_dict
from agentenv.engines.base import GenerationEngine
from agentenv.engines.busy import BusyClock, BusyTrackingEngine
from agentenv.engines.supervised import SupervisedEngine, rebuild_from_learner
from agentenv.errors import AgentEnvError, ConfigError, Interrupted, RunFolderError
from agentenv.faults import FAULTS
from agentenv.forced_lag import LaggedWeights, Snapshot
from agentenv.malloc import release_free_heap
from agentenv.models import check_model
from agentenv.output_folders import RUN, claim_folder
from agentenv.pool import BatchSelection, TrajectoryPool
from agentenv.trainer import setup
from agentenv.trainer.checkpoint import CheckpointManager
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.heldout import evaluate_held_out, held_out_tasks
from agentenv.trainer.learner_contract import PolicyLearner
from agentenv.trainer.metrics import MetricsWriter
from agentenv.trainer.overlap import LoopBusy, overlap, timed_env_factory
from agentenv.trainer.pause import pause_point
from agentenv.trainer.plots import plot_run
from agentenv.trainer.recipe_files import find_recipe, recipe_data
from agentenv.trainer.resume import Resumed, ensure_run_id, run_identity, run_state
from agentenv.trainer.resume import resume as resume_run
from agentenv.trainer.setup import LoopParts
from agentenv.trainer.update_step import UpdateStats
from agentenv.trajectory import Trajectory

logger = logging.getLogger("agentenv.train")



def failure_limit(concurrency: int) -> int:
    """Failures in a row after which training stops with an error: ``max(16, 4 * concurrency)``.

    Counted by the collector in completion order: failed episodes (retries included), errors handing
    a trajectory to the pool, and crashed workers; a good episode resets the count. A broken
    environment, sandbox or engine reaches it within a few hundred episodes; intermittent failures
    (say 30%) practically never do (the rule and its numbers: :mod:`agentenv.collector`).
    """
    return max(16, 4 * concurrency)


# ---------------------------------------------------------------------------------------------
# 1. configuration
# ---------------------------------------------------------------------------------------------
def resolve_recipe(name: str) -> Path:
    """A recipe name (``recipes/<name>.yaml``) or a path to a YAML file.

    Raises:
        ConfigError: No such recipe or file; the message lists the shipped ones.
    """
    return find_recipe(name)


def parse_args(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Command line -> config. ``--section.field value`` and ``section.field=value`` override the recipe."""
    ap = argparse.ArgumentParser(
        prog="agentenv train", description=__doc__.split("\n\n")[0],
        epilog="Any config value can be set with --section.field VALUE or section.field=VALUE "
               "(e.g. --optim.lr 1e-5 run.batch_size=16); --print-config shows them all, --help-config says "
               "what each means.")
    ap.add_argument("--recipe", help="recipe name in recipes/ or a YAML path (default: <env>_cpu)")
    ap.add_argument("--env", help="environment id (env.id)")
    ap.add_argument("--model", help="local model folder or mapped name (model.name); default: embedded SmolLM2-135M")
    ap.add_argument("--run-dir", help="run folder (run.run_dir)")
    ap.add_argument("--updates", type=int, help="optimizer steps (run.updates)")
    ap.add_argument("--mode", choices=["async", "sync"], help="run.mode")
    ap.add_argument("--policy", choices=["none", "max_lag", "pace", "sync"], help="staleness.policy")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    ap.add_argument("--overwrite", action="store_true", help="delete an existing run folder first")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    ap.add_argument("--help-config", nargs="?", metavar="SECTION", action=_ConfigHelp,
                    help="list every config value (or a section's: optim, run, ...) with its type, default "
                         "and meaning, and exit")
    args, rest = ap.parse_known_args(argv)
    overrides = _dotted_overrides(rest)
    data = recipe_data(args.recipe, args.env)  # the generic recipe names its run folder after the env
    for flag, key in (("env", "env.id"), ("model", "model.name"), ("run_dir", "run.run_dir"),
                      ("updates", "run.updates"), ("mode", "run.mode"), ("policy", "staleness.policy")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if args.policy == "sync" and args.mode is None:
        overrides.append("run.mode=sync")
    cfg = load_config(TrainConfig, apply_overrides(data, overrides))
    args.overrides = overrides  # re-applied to the saved config by --resume
    return cfg, args


class _ConfigHelp(argparse.Action):
    """``--help-config [SECTION]``: the documented config values (:mod:`agentenv.config_help`), then exit."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from agentenv.config_help import format_config_help

        try:
            text = format_config_help(TrainConfig, values)
        except KeyError:
            parser.error(f"--help-config: no config section or value {values!r} (sections: "
                         f"{', '.join(f.name for f in dataclasses.fields(TrainConfig))})")
        print(f"{text}\n\nDefaults of the config classes; a recipe sets its own (--print-config shows them). "
              "Set any value with --section.field VALUE or section.field=VALUE.")
        parser.exit()


def _dotted_overrides(rest: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(rest):
        a = rest[i]
        if "=" in a and not a.startswith("-"):
            out.append(a)
        elif a.startswith("--") and "." in a:
            key, eq, val = a[2:].partition("=")
            if not eq:
                if i + 1 >= len(rest):
                    raise ConfigError(f"{a} needs a value")
                i += 1
                val = rest[i]
            out.append(f"{key.replace('-', '_')}={val}")
        else:
            raise ConfigError(f"unrecognised argument {a!r} (overrides look like --optim.lr 1e-5 or optim.lr=1e-5)")
        i += 1
    return out


def prepare_run_dir(cfg: TrainConfig, *, resume: bool, overwrite: bool) -> Path:
    """Create the run folder, refusing to write into an existing run unless asked.

    The config is written by :func:`train` once the model and environment have loaded, so a start
    that fails early (a wrong model path, Ctrl-C in the warm-up) leaves an empty, reusable folder.

    Raises:
        RunFolderError: The folder holds files and neither ``--resume`` nor ``--overwrite`` was
            given, ``--resume`` was given for a folder with no run, or the folder holds files and is
            not a run folder (``--overwrite`` deletes nothing else: :mod:`agentenv.output_folders`).
    """
    run_dir = Path(cfg.run.run_dir)
    exists = (run_dir / "config.yaml").exists()
    if resume:
        if not exists:
            raise RunFolderError(f"--resume: {run_dir} holds no run (no config.yaml); start it without --resume")
        return run_dir
    return claim_folder(run_dir, RUN, overwrite=overwrite)


def resumed_config(run_dir: Path, overrides: list[str]) -> TrainConfig:
    """The run's saved ``config.yaml`` changed only by ``overrides`` (what ``--resume``'s command line says).

    Raises:
        RunFolderError: The folder has no saved config (the run never got past loading its model).
        ConfigError: An override does not fit the config.
    """
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise RunFolderError(f"--resume: {run_dir} holds no run (no config.yaml); start it without --resume")
    try:
        return load_config(TrainConfig, apply_overrides(read_yaml(path), overrides))
    except ConfigError as exc:
        raise ConfigError(f"--resume: {path}: {exc}") from exc


# ---------------------------------------------------------------------------------------------
# 2-5. the loop
# ---------------------------------------------------------------------------------------------
async def train(cfg: TrainConfig, run_dir: Path, *, resume: bool = False, stop: asyncio.Event | None = None,
                loop_seconds: float | None = None, parts: LoopParts | None = None) -> dict[str, Any]:
    """Train for ``cfg.run.updates`` updates and return the final summary (also written to ``summary.json``).

    Args:
        cfg: The whole run's config.
        run_dir: The run folder (:func:`prepare_run_dir` made it).
        resume: Continue from the folder's latest checkpoint (:mod:`agentenv.trainer.resume`).
        stop: Set to interrupt (Ctrl-C): the update at hand finishes, a checkpoint is written, the
            held-out evaluation after training is skipped (or cancelled), ``interrupted`` is True.
        loop_seconds: A budget for the update loop (seconds from the loop's start, collector start
            included; model load, warm-up and the "before" evaluation are outside it; <= 0: no
            batch at all), as ``agentenv study``'s equal
            wall-clock uses: when it is spent the loop ends after the update at hand, and the run is
            complete (evaluated after training; ``budget_spent`` True, ``interrupted`` False).
        parts: How the policy, environments, learner and engine are built (:class:`LoopParts`);
            None: from the config, as ``agentenv train`` does.
    """
    stop = stop or asyncio.Event()
    halt = asyncio.Event()  # ends the update loop: a stop or a spent budget
    watcher = asyncio.ensure_future(_set_when(stop, halt))
    try:
        return await _train(cfg, run_dir, parts or LoopParts(), resume=resume, stop=stop, halt=halt,
                            loop_seconds=loop_seconds)
    finally:
        watcher.cancel()


async def _set_when(event: asyncio.Event, target: asyncio.Event) -> None:
    await event.wait()
    target.set()


async def _train(cfg: TrainConfig, run_dir: Path, parts: LoopParts, *, resume: bool, stop: asyncio.Event,
                 halt: asyncio.Event, loop_seconds: float | None) -> dict[str, Any]:
    """:func:`train`'s body: ``halt`` ends the update loop, ``stop`` also skips the evaluation after it."""
    random.seed(cfg.run.seed)
    torch.manual_seed(cfg.run.seed)
    t_start = time.time()

    # the environment before the model: a wrong id or constructor argument (env.kwargs, env.eval_kwargs),
    # a warm-up or held-out evaluation the env cannot serve, fails in seconds
    parts.env_factory(cfg)  # checks the id and the constructor arguments; built for real below, with the renderer
    setup.check_warmup(cfg)
    if cfg.eval.problems:
        await held_out_tasks(cfg)

    # 2. model: learner copy + engine copy (+ cached warm-up; Ctrl-C stops it between steps)
    model, tokenizer, renderer = await asyncio.to_thread(parts.load_policy, cfg, should_stop=stop.is_set)
    env_factory = parts.env_factory(cfg, renderer)  # an env taking tool_parser gets the template's (unless set)
    learner = parts.build_learner(cfg, model)
    # an engine that dies is rebuilt from the learner's latest weights (agentenv/engines/supervised.py);
    # the learner lock keeps a rebuild from reading the weights while the learner steps
    learner_lock = asyncio.Lock()
    lag: LaggedWeights | None = None  # staleness.forced_lag: the engine serves the learner's weights k versions late

    async def rebuild_engine(dead: GenerationEngine) -> GenerationEngine:
        async with learner_lock:  # under a forced lag the rebuilt engine serves the lagged weights
            source = lag.engine_source(learner) if lag is not None else learner
            return await rebuild_from_learner(dead, source, lambda m: parts.build_engine(cfg, m, tokenizer))

    FAULTS.reset()  # faults/* count from this run's start
    engine = BusyTrackingEngine(SupervisedEngine(parts.build_engine(cfg, copy.deepcopy(model), tokenizer),
                                                 rebuild_engine))
    group_size = cfg.objective.grpo_group_size if cfg.objective.name == "grpo" else 1  # rollouts per task
    pool = TrajectoryPool(cfg.staleness, group_size=group_size)
    checkpoints = CheckpointManager(run_dir / "checkpoints")
    busy = LoopBusy(engine.clock)  # engine, environments and learner busy in the update loop (trainer/overlap.py)

    collector = RolloutCollector(
        timed_env_factory(env_factory, busy.env),
        engine,
        renderer,
        cfg.rollout,
        None,
        on_group=pool.add_group,
        concurrency=cfg.run.concurrency,
        version_fn=lambda: learner.version,
        first_seed=cfg.run.seed * 1_000_003,
        admit=lambda: len(pool) < cfg.run.max_pool_size,
        max_retries=cfg.run.max_task_retries,
        group_size=group_size,
        failure_limit=failure_limit(cfg.run.concurrency),
    )
    identity = run_identity(cfg, group_size, ensure_run_id(run_dir))

    def checkpoint_extra() -> dict[str, Any]:  # taken on the loop: the pool and the tasks change there
        return run_state(pool, collector, identity, run_dir, resumed)

    # the pool, the tasks in flight (requeued), the learner; the logs cut back to the checkpoint
    # (trainer/resume.py)
    resumed = resume_run(run_dir, checkpoints, learner, pool, collector, identity) if resume else Resumed()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))  # a refused resume keeps it
    if learner.version != engine.version:
        await engine.update_weights(learner.weights_for_engine(), learner.version)
    if cfg.staleness.forced_lag:  # the lag counts from here (after a resume it builds up again)
        lag = LaggedWeights(cfg.staleness.forced_lag, learner.version,
                            await asyncio.to_thread(learner.weights_for_engine))
    metrics = MetricsWriter(run_dir)
    saved_version = saved_at_start = learner.version
    if cfg.eval.problems and not (run_dir / "eval_before.json").exists():
        await held_out(cfg, engine, renderer, run_dir, "before", stop)

    summary: dict[str, Any] = {}
    t_loop = time.time()
    spent = asyncio.Event()  # loop_seconds passed

    def spend() -> None:
        spent.set()
        halt.set()

    timer = None
    if loop_seconds is not None and loop_seconds <= 0:  # nothing left (a resumed budget): not one batch
        spend()
    elif loop_seconds is not None:
        timer = asyncio.get_running_loop().call_later(loop_seconds, spend)
    busy.start()
    # under a time budget the updates are as many as fit: the bar counts them without an end
    progress = setup.progress_bar(total=cfg.run.updates if loop_seconds is None else None, initial=learner.version)
    staleness_log = (run_dir / "staleness.jsonl").open("a")
    decisions_log = (run_dir / "decisions.jsonl").open("a")
    rejected_now: list[Trajectory] = []  # rejected while waiting for the current batch
    probe: list[Trajectory] = []  # run.entropy_probe rows of the first batch: fixed states for the entropy
    probe_entropy: float | None = None

    def on_decision(sel: BatchSelection) -> None:
        rejected_now.extend(sel.rejected)
        if cfg.staleness.requeue_rejected:
            for traj in sel.rejected:
                collector.requeue(traj)
        decisions_log.write(json.dumps(sel.decision.to_dict()) + "\n")

    try:
        if cfg.run.mode == "async":
            await collector.start()
        batches = 0  # consumed, with or without an optimizer step
        while learner.version < cfg.run.updates and not halt.is_set():
            if batches >= cfg.run.batch_limit:
                logger.warning("stopping after %d batches: only %d of them carried gradient (run.max_batches)",
                               batches, learner.version - saved_at_start)
                break
            # 3. rollout (sync mode: generate exactly B, nothing overlaps with training)
            t_wait = time.time()
            rejected_now.clear()
            # B good trajectories: B / n whole groups (raises past the failure limit); a split episode
            # (rollout.on_prefix_violation=split) may leave samples over B in the pool, so collect what is missing
            missing = cfg.run.batch_size - len(pool)
            if cfg.run.mode == "sync" and missing > 0:
                trajs = await collector.collect(-(-missing // group_size) * group_size)
                for i in range(0, len(trajs), group_size):
                    pool.add_group(trajs[i : i + group_size])
            selection = await next_batch(pool, learner, cfg, halt, on_decision, collector, busy.learner)
            decisions_log.flush()
            if selection is None:
                break
            wait_s = time.time() - t_wait

            # 4. update: one optimizer step on this fresh batch, then the weights go to the engine.
            # A batch without gradient takes no step (the version stays, the engine keeps its weights,
            # so the next batch is gated at the same lag); it is discarded all the same.
            t_update, consumed_at = time.time(), learner.version
            with busy.learner.running():  # the learner is busy until the engine holds the new weights
                async with learner_lock:
                    stats = await asyncio.to_thread(_step, learner, selection)
                update_s = time.time() - t_update
                await asyncio.to_thread(release_free_heap)  # the step's freed activations leave the process
                if stats.stepped:  # the state-dict copy runs in a worker thread too
                    weights = await asyncio.to_thread(learner.weights_for_engine)
                    due = Snapshot(learner.version, weights) if lag is None else lag.push(learner.version, weights)
                    if due is not None:  # under staleness.forced_lag, the snapshot of k versions ago (or none)
                        await engine.update_weights(due.weights, due.version)
                    del weights, due  # the engine has copied them in: this copy must not live through the next step
                if stats.stepped and cfg.run.entropy_probe:  # the same states after every update
                    probe = probe or list(selection.batch[: cfg.run.entropy_probe])
                    probe_entropy = await asyncio.to_thread(learner.entropy, probe)
            batches += 1

            # 5. logging: one row per consumed batch (``update`` is the policy version after it)
            row = setup.update_metrics(learner.version, selection, stats, pool, collector, wait_s, update_s, t_start,
                                       consumed_at=consumed_at)
            row["pool/rejected"] = len(rejected_now)
            if probe_entropy is not None:
                row["probe/policy_entropy"] = probe_entropy
            row.update(busy.figures())  # busy/engine_s, busy/env_s, busy/learner_s, busy/wall_s: since the loop began
            row["engine/busy_share"] = row["busy/engine_s"] / max(row["busy/wall_s"], 1e-9)
            row["train/batches"] = batches
            row.update(resumed.figures())  # resume/count, resume/requeued_tasks_total (in-flight tasks replayed)
            row.update(FAULTS.report())  # faults/engine_rebuilds, sandbox_replaced, env_replaced, grader_kills, ...
            metrics.log(batches, row)
            for traj in selection.batch:  # with the collector's task seed: some envs' task ids repeat across seeds
                record = {**setup.consumed_record(traj, consumed_at), "seed": traj.info.get("seed")}
                staleness_log.write(json.dumps(record) + "\n")
            staleness_log.flush()
            progress.set_postfix(setup.postfix(row), refresh=False)
            progress.update(int(stats.stepped))
            if stats.stepped and learner.version % cfg.run.checkpoint_every == 0:
                # the pool's state is taken on the loop (it changes there); the write runs in a thread
                await asyncio.to_thread(checkpoints.save, learner, extra=checkpoint_extra())
                saved_version = learner.version
            summary = row
    finally:
        if timer is not None:  # the loop is over: a budget that runs out while closing was not spent on it
            timer.cancel()
        loop_busy = busy.figures()
        progress.close()
        staleness_log.close()
        decisions_log.close()
        await collector.close()
        train_s = time.time() - t_loop
        if learner.version != saved_version:
            checkpoints.save(learner, extra=checkpoint_extra())
        # evaluated after training: when this process trained, or when an earlier process of the run
        # trained and was stopped before its evaluation after (resumed with nothing left to train)
        unevaluated = learner.version > 0 and not (run_dir / "eval_after.json").exists()
        trained = learner.version > saved_at_start or unevaluated
        if cfg.eval.problems and not stop.is_set() and trained:
            if engine.version != learner.version:  # a forced lag: the held-out policy is the trained one
                await engine.update_weights(await asyncio.to_thread(learner.weights_for_engine), learner.version)
            after = await held_out(cfg, engine, renderer, run_dir, "after", stop)
            if after is not None:
                summary["eval/after"] = after
        await engine.close()
        metrics.close()
        await asyncio.to_thread(plot_run, run_dir)
    before, after = run_dir / "eval_before.json", run_dir / "eval_after.json"
    if before.exists():
        summary["eval/before"] = json.loads(before.read_text())["success_rate"]
    if before.exists() and after.exists():
        summary.update(setup.held_out_change(json.loads(before.read_text()), json.loads(after.read_text())))
    summary = {**summary, **overlap(loop_busy["busy/engine_s"], loop_busy["busy/env_s"], loop_busy["busy/learner_s"],
                                    loop_busy["busy/wall_s"]),
               "updates": learner.version, "train_s": train_s, "wall_clock_s": time.time() - t_start,
               "peak_rss_gb": setup.peak_rss_gb(), "interrupted": stop.is_set(),
               "budget_spent": spent.is_set()}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


async def held_out(cfg: TrainConfig, engine: GenerationEngine, renderer: ChatRenderer, run_dir: Path, label: str,
                   stop: asyncio.Event) -> float | None:
    """Evaluate the engine's policy on the held-out tasks; write ``eval_<label>.json``; return the success rate.

    Returns None, writing nothing, when ``stop`` is set before the evaluation finishes (it is cancelled).
    """
    evaluation = asyncio.ensure_future(evaluate_held_out(cfg, engine, renderer, label=label))
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait({evaluation, stopped}, return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    await asyncio.to_thread(release_free_heap)
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


def _step(learner: PolicyLearner, selection: BatchSelection) -> UpdateStats:
    """One learner update on the selected batch (in a worker thread), then the ``update`` pause point."""
    stats = learner.update(selection.batch, scores=selection.scores)
    pause_point("update")  # tests: AGENTENV_PAUSE_AT=update:K kills a run here (trainer/pause.py)
    return stats


async def next_batch(pool: TrajectoryPool, learner: PolicyLearner, cfg: TrainConfig, stop: asyncio.Event,
                     on_decision: Callable[[BatchSelection], None], collector: RolloutCollector,
                     learner_clock: BusyClock | None = None) -> BatchSelection | None:
    """Wait until the pool yields a full batch of B under the staleness policy (None when stopped).

    PACE's scoring passes (``staleness.drift_mode=scoring``) run on ``learner_clock`` when given.

    Every selection attempt is a logged decision: ``on_decision(selection)`` sees each one, also
    the attempts that rejected trajectories but left too few for a batch. Failed episodes never
    reach the pool (the collector replays or drops their tasks), so the wait ends either with a
    batch or with the failure rule below; the collector's workers survive any episode's error.

    Raises:
        AgentEnvError: :func:`failure_limit` failures in a row (``collector.failure_streak``; a
            broken environment, sandbox or engine); the message carries the last error. Checked
            every 50 ms, so an asynchronous run stops within that of the collector's limit.
    """
    scoring = cfg.staleness.policy == "pace" and cfg.staleness.drift_mode == "scoring"
    scores = OffLoopScores(learner, learner_clock) if scoring else None
    watch = collector.no_update_watch()  # warns when the wait passes collector.no_update_warning_s
    while not stop.is_set():
        if collector.failure_streak >= failure_limit(cfg.run.concurrency):
            raise AgentEnvError(f"the last {collector.failure_streak} episodes all failed; "
                                f"the latest with: {collector.last_error}")
        if len(pool) >= cfg.run.batch_size:
            if scores is not None:  # the forward passes run in a worker thread, episodes go on
                await scores.prepare(pool.trajectories)
            scorer = scores.lookup if scores is not None else None
            selection = pool.select_batch(cfg.run.batch_size, learner.version, drift_scorer=scorer)
            on_decision(selection)
            if selection.batch:
                return selection
        watch.check(f"{len(pool)} of {cfg.run.batch_size} trajectories in the pool")
        await asyncio.sleep(0.05)
    return None


class OffLoopScores:
    """PACE's scoring passes (current log pi of pooled trajectories) computed off the event loop.

    ``TrajectoryPool.select_batch`` calls its drift scorer synchronously; a forward pass there would
    stall every episode of the collector for its length. :meth:`prepare` scores the pooled
    trajectories not yet scored in a worker thread (the pool is only read, on the loop, for the
    list); :meth:`lookup`, the scorer handed to the pool, then answers from that cache and scores on
    the loop only what arrived after ``prepare`` (a trajectory or two). One instance serves one call
    of :func:`next_batch`, during which the learner's version does not move, so the scores stay valid.

    Args:
        learner: Scores with ``learner.score``.
        clock: The learner's busy clock, run while it scores (a fresh one by default).
    """

    def __init__(self, learner: PolicyLearner, clock: BusyClock | None = None) -> None:
        self.learner = learner
        self.clock = clock or BusyClock()
        self.cache: dict[str, torch.Tensor] = {}

    async def prepare(self, trajectories: Sequence[Trajectory]) -> None:
        """Score, in a worker thread, those of ``trajectories`` not cached yet."""
        todo = [t for t in trajectories if t.id not in self.cache]
        if todo:
            with self.clock.running():
                out = await asyncio.to_thread(self.learner.score, todo)
            self.cache.update(zip((t.id for t in todo), out, strict=True))

    def lookup(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """The drift scorer for ``select_batch``: cached scores, missing ones computed here."""
        missing = [t for t in trajectories if t.id not in self.cache]
        if missing:
            with self.clock.running():
                out = self.learner.score(missing)
            self.cache.update(zip((t.id for t in missing), out, strict=True))
        return [self.cache[t.id] for t in trajectories]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``agentenv train``; returns the process exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        cfg, args = parse_args(list(sys.argv[1:] if argv is None else argv))
        if not args.resume:  # before the run folder exists; and a config --print-config shows is one the run takes
            setup.check_env_arguments(cfg)
        if args.print_config:
            print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
            return 0
        check_model(cfg.model.name)  # a model that cannot be found fails before the run folder is made
        run_dir = prepare_run_dir(cfg, resume=args.resume, overwrite=args.overwrite)
        if args.resume:
            cfg = resumed_config(run_dir, args.overrides)
    except AgentEnvError as exc:
        print(f"agentenv train: {exc}", file=sys.stderr)
        return 2
    print(f"agentenv train: run folder {run_dir}", file=sys.stderr)

    async def run() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:  # Ctrl-C: finish the step or update at hand, checkpoint, stop
            if not stop.is_set():
                print("\nagentenv train: stopping (finishing the current step; a final checkpoint follows)",
                      file=sys.stderr)
            stop.set()

        loop.add_signal_handler(signal.SIGINT, on_signal)
        loop.add_signal_handler(signal.SIGTERM, on_signal)
        return await train(cfg, run_dir, resume=args.resume, stop=stop)

    try:
        summary = asyncio.run(run())
    except Interrupted as exc:
        print(f"agentenv train: {exc}", file=sys.stderr)
        return 130
    except AgentEnvError as exc:
        print(f"agentenv train: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=2))
    if (failed := setup.shortfall(cfg, summary)) is not None:
        print(f"agentenv train: {failed}", file=sys.stderr)
        return 1
    return 130 if summary.get("interrupted") else 0
