"""Builders and small helpers for the training recipe (kept out of it so it reads top to bottom)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from tqdm.auto import tqdm

from agentenv.chat import ChatRenderer
from agentenv.configio import to_dict
from agentenv.core import Env
from agentenv.errors import ConfigError
from agentenv.paths import cache_dir
from agentenv.registration import make
from agentenv.trainer.config import TrainConfig
from agentenv.trajectory import Trajectory

logger = logging.getLogger(__name__)


# -- problems -------------------------------------------------------------------------------------
def select_problems(name: str, max_chars: int | None) -> list[Any] | None:
    """Problems of data set ``name``, optionally only those at most ``max_chars`` long; None keeps the env's own."""
    if max_chars is None:
        return None
    from agentenv.datasets import load_math

    problems = [p for p in load_math(name) if len(p.problem) <= max_chars]
    if not problems:
        raise ConfigError(f"env.max_problem_chars={max_chars} leaves no problem in {name!r}")
    return problems


def env_factory(cfg: TrainConfig) -> Callable[[], Env]:
    """A builder of training environments: ``make(cfg.env.id, ...)`` with the recipe's settings.

    ``python_tool`` plays ``env.dataset`` (optionally only problems of at most ``env.max_problem_chars``);
    ``alfworld`` plays the ``train`` split unless ``env.kwargs.split`` says otherwise, listed once
    here; both end an episode after ``rollout.max_turns`` turns.

    Raises:
        EnvNotFound: ``env.id`` is not registered.
        DataError: The data set or ALFWorld split cannot be read.
    """
    kwargs = dict(cfg.env.kwargs)
    if cfg.env.id == "python_tool":
        kwargs.setdefault("dataset", cfg.env.dataset)
        kwargs.setdefault("max_turns", cfg.rollout.max_turns)
        problems = select_problems(cfg.env.dataset, cfg.env.max_problem_chars)
        if problems is not None:
            kwargs["problems"] = problems
    elif cfg.env.id == "alfworld":  # the train split (3553 games; extracted into the cache once)
        from agentenv.envs.alfworld import list_games

        kwargs.setdefault("split", "train")
        kwargs.setdefault("max_steps", cfg.rollout.max_turns)
        kwargs.setdefault("games", list_games(kwargs["split"], kwargs.get("data_root")))
    make(cfg.env.id, **kwargs)  # fail now, with a clear error, rather than inside a worker
    return lambda: make(cfg.env.id, **kwargs)


# -- model ----------------------------------------------------------------------------------------
def load_policy(
    cfg: TrainConfig, *, should_stop: Callable[[], bool] | None = None
) -> tuple[torch.nn.Module, Any, ChatRenderer]:
    """Load the policy and its tokenizer; apply the (cached) tool-use warm-up when configured.

    Raises:
        Interrupted: ``should_stop()`` became true during the warm-up (nothing is cached then).
    """
    from agentenv.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(cfg.model.name, device=cfg.model.device)
    renderer = ChatRenderer(tokenizer)
    if cfg.warmup.steps > 0 and cfg.env.id == "python_tool":
        model = warmed_up(cfg, model, tokenizer, renderer, should_stop=should_stop)
    model.eval()
    return model, tokenizer, renderer


def warmed_up(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, renderer: ChatRenderer, *,
              should_stop: Callable[[], bool] | None = None) -> torch.nn.Module:
    """The model after the scripted tool-use warm-up, computed once and cached by its settings.

    Raises:
        Interrupted: ``should_stop()`` became true between two warm-up steps (nothing cached).
    """
    import random

    from agentenv.envs.python_tool import PythonToolEnv, format_result
    from agentenv.sandboxes.base import ExecResult, ExecStatus
    from agentenv.trainer.warmup import build_transcript, scripted_problem, sft_warmup

    key = hashlib.sha256(json.dumps([cfg.model.name, to_dict(cfg.warmup), 3]).encode()).hexdigest()[:12]
    folder = cache_dir("warmup", key)
    weights = folder / "model.pt"
    if weights.is_file():
        model.load_state_dict(torch.load(weights, map_location="cpu"))
        logger.info("tool-use warm-up loaded from cache %s", folder)
        return model
    rng = random.Random(cfg.warmup.seed)
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731 (scripted text, not sampled)
    examples = [
        build_transcript(renderer, encode, scripted_problem(rng), system=PythonToolEnv.system_prompt,
                         tools=PythonToolEnv.tools,
                         format_observation=lambda out: format_result(ExecResult(ExecStatus.OK, stdout=out), 4000))
        for _ in range(cfg.warmup.num_examples)
    ]
    t0 = time.time()
    bar = tqdm(total=cfg.warmup.steps, desc="tool-use warm-up", unit="step")

    def log(step: int, loss: float) -> None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", refresh=False)

    try:
        losses = sft_warmup(model, examples, cfg.warmup, log=log, should_stop=should_stop)
    finally:
        bar.close()
    tmp = folder / "model.pt.tmp"
    torch.save(model.state_dict(), tmp)
    tmp.replace(weights)
    (folder / "warmup.json").write_text(json.dumps({"losses": losses, "seconds": time.time() - t0}))
    return model


def build_learner(cfg: TrainConfig, model: torch.nn.Module) -> Any:
    """The learner of ``cfg.learner.backend`` on ``model`` (:func:`agentenv.trainer.learner_backends.build_learner`)."""
    from agentenv.trainer.learner_backends import build_learner as build

    return build(cfg, model, warmed_up=cfg.warmup.steps > 0 and cfg.env.id == "python_tool")


def build_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any) -> Any:
    """The generation engine the config names, serving policy version 0.

    vLLM gets the model written to a temporary folder (bfloat16 weights on a GPU) and the memory share
    of ``model.memory_share``.

    Raises:
        ConfigError: vLLM asked for but not installed.
        EngineError: The engine failed to start.
    """
    from agentenv.engines.base import ContinuationMode

    mode = ContinuationMode(cfg.model.continuation)
    if cfg.model.engine == "vllm":
        from agentenv.engines.vllm_engine import VLLMEngine

        gpu = torch.cuda.is_available()
        share = cfg.model.memory_share or (0.2 if not gpu else 0.9 if cfg.learner.backend == "ray" else 0.45)
        return VLLMEngine.from_model(model, tokenizer, continuation=mode, seed=cfg.run.seed,
                                     max_batch_size=cfg.model.max_batch_size, dtype="bfloat16" if gpu else "auto",
                                     gpu_memory_utilization=share)
    from agentenv.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, tokenizer, max_batch_size=cfg.model.max_batch_size, continuation=mode,
                              seed=cfg.run.seed)


# -- logging --------------------------------------------------------------------------------------
def progress_bar(total: int, initial: int) -> tqdm:
    """The run's progress bar (updates)."""
    return tqdm(total=total, initial=initial, desc="updates", unit="update", dynamic_ncols=True)


def consumed_record(traj: Trajectory, version: int) -> dict[str, Any]:
    """One line of ``staleness.jsonl``: a trajectory's staleness when the learner at ``version`` used it."""
    return {
        "id": traj.id, "task_id": traj.task_id, "version": version, "reward": traj.reward,
        "gs": traj.generation_staleness(), "ws": traj.waiting_staleness(version),
        "segments": len(traj.segments), "policy_tokens": traj.num_policy_tokens,
        "turns": traj.info.get("turns"), "tool_calls": traj.info.get("tool_calls"),
    }


def update_metrics(version: int, selection: Any, stats: Any, pool: Any, collector: Any,
                   wait_s: float, update_s: float, t_start: float, *, consumed_at: int | None = None) -> dict[str, Any]:
    """The metrics row of one update: objective stats, rewards, lengths, staleness, pool, failures, timing.

    ``version`` is the policy version after the update; ``consumed_at`` the version that consumed the
    batch (waiting staleness is measured against it; default ``version - 1``, an update that stepped).

    ``episodes/failed``, ``episodes/retried`` and ``episodes/dropped_tasks`` count since the previous
    row (:meth:`RolloutCollector.report_counts`, so call this once per update); ``episodes/errors``
    and the ``*_total`` keys count from the start of this process.
    """
    batch = selection.batch
    dec = selection.decision
    row: dict[str, Any] = {"update": version}
    row.update({f"learner/{k}": v for k, v in stats.to_dict().items()})
    rewards = [t.reward for t in batch]
    row["reward/mean"] = sum(rewards) / len(rewards)
    row["length/policy_tokens"] = sum(t.num_policy_tokens for t in batch) / len(batch)
    row["length/turns"] = sum(t.info.get("turns", 0) for t in batch) / len(batch)
    row["tools/calls"] = sum(t.info.get("tool_calls", 0) or 0 for t in batch) / len(batch)
    gs = [t.generation_staleness() for t in batch]
    ws = [t.waiting_staleness(version - 1 if consumed_at is None else consumed_at) for t in batch]
    row["staleness/gs_mean"] = sum(gs) / len(gs)
    row["staleness/ws_mean"] = sum(ws) / len(ws)
    row["staleness/gs_max"] = max(gs)
    row["staleness/ws_max"] = max(ws)
    row["pool/occupancy"] = dec.occupancy
    row["pool/rejected"] = dec.rejected_count
    row["pool/rate"] = dec.rate
    row["pool/after"] = len(pool)
    row["episodes/finished"] = collector.episodes_finished
    row["episodes/errors"] = collector.errors
    # failed episodes never enter a batch: failed/retried/dropped_tasks this update, and *_total
    row.update({f"episodes/{k}": v for k, v in collector.report_counts().items()})
    row["time/wait_s"] = wait_s
    row["time/update_s"] = update_s
    row["time/elapsed_s"] = time.time() - t_start
    row["memory/peak_rss_gb"] = peak_rss_gb()
    return row


def held_out_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Summary keys for the held-out change between two ``eval_*.json`` reports of one run.

    ``eval/delta`` is after minus before (fraction of tasks); ``eval/ci95`` the paired-bootstrap
    95% interval over tasks and ``eval/ci95_two_proportion`` the unpaired Wald interval
    (:mod:`agentenv.trainer.significance`). Reports without per-task outcomes, or of different
    task lists, give only ``eval/delta``.
    """
    from agentenv.trainer.significance import paired_bootstrap, two_proportion_interval

    out: dict[str, Any] = {"eval/delta": after["success_rate"] - before["success_rate"]}
    b, a = before.get("outcomes") or [], after.get("outcomes") or []
    if b and a and before.get("task_ids") == after.get("task_ids"):
        paired = paired_bootstrap(b, a)
        out["eval/ci95"] = [paired.low, paired.high]
        out["eval/ci95_excludes_zero"] = paired.excludes_zero
        unpaired = two_proportion_interval(b, a)
        out["eval/ci95_two_proportion"] = [unpaired.low, unpaired.high]
    return out


def peak_rss_gb() -> float:
    """Peak resident memory of this process so far (GB, 1e9 bytes; Linux reports ru_maxrss in KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def postfix(row: dict[str, Any]) -> dict[str, str]:
    """The progress bar's short figures: reward, staleness, admission, trajectories."""
    return {
        "reward": f"{row['reward/mean']:.2f}",
        "GS": f"{row['staleness/gs_mean']:.2f}",
        "WS": f"{row['staleness/ws_mean']:.2f}",
        "admit": f"{row.get('learner/admitted_fraction', float('nan')):.2f}",
        "traj": str(row["episodes/finished"]),
    }
