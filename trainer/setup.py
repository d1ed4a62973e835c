"""Builders and small helpers for the training recipe (kept out of it so it reads top to bottom)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from agentenv.configio import to_dict
from agentenv.core import Env, has_scripted_demonstrations
from agentenv.engines.supervised import rebuild_from_learner
from agentenv.errors import ConfigError
from agentenv.paths import cache_dir
from agentenv.registration import checked_arguments, make, spec
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.episode import is_token_budget_cut
from agentenv.step_latency import StepLatency
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.demonstrations import render_demonstration
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trainer.sync_check import SyncCheck, sync_check
from agentenv.trainer.warmup import WARMUP_EXAMPLES, WARMUP_SEED
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.engines.base import GenerationEngine
    from agentenv.rollout.collector import RolloutCollector
    from agentenv.rollout.pool import BatchSelection, TrajectoryPool
    from agentenv.trainer.learners.update_step import UpdateStats

logger = logging.getLogger(__name__)


# -- environment ----------------------------------------------------------------------------------
def env_factory(cfg: TrainConfig, renderer: ChatRenderer | None = None) -> Callable[[], Env]:
    """A builder of training environments: ``make(cfg.env.id, **cfg.env.kwargs)`` (``remote=`` ``env.remote``).

    One environment is built here, so that a wrong id or constructor argument fails now with a clear
    error rather than inside a worker. With ``renderer`` (the policy's :class:`ChatRenderer`), an env
    whose constructor takes ``tool_parser`` gets the parser its chat template implies when neither the
    config nor the registration sets one (:func:`default_env_kwargs`). With
    ``env.step_latency.median_s > 0`` every environment built is wrapped in
    :class:`~agentenv.step_latency.StepLatency` (a seeded lognormal delay before each step).

    Raises:
        EnvNotFound: ``env.id`` is not registered.
        ConfigError: ``env.kwargs`` holds an argument the constructor does not take (the message
            lists the ones it takes), or a value it refuses.
        DataError: The env's data cannot be read.
        RemoteEnvError: ``env.remote`` is set and no server answers.
    """
    kwargs: dict[str, Any] = {**default_env_kwargs(cfg, renderer), **cfg.env.kwargs}
    if cfg.env.remote is not None:  # agentenv serve servers (agentenv.remote.RemoteEnv)
        kwargs["remote"] = cfg.env.remote
    make(cfg.env.id, **kwargs)
    latency = cfg.env.step_latency
    if latency.enabled:
        return lambda: StepLatency(make(cfg.env.id, **kwargs), latency)
    return lambda: make(cfg.env.id, **kwargs)


def check_env_arguments(cfg: TrainConfig) -> None:
    """Check ``env.kwargs`` and ``env.eval_kwargs`` by name against the env's constructor; build nothing.

    ``--print-config`` runs it, so that a config it prints is one the run accepts. A remote env's
    arguments belong to its servers and are not checked here.

    Raises:
        EnvNotFound: ``env.id`` is not registered.
        ConfigError: An argument the constructor does not take (the message lists the ones it takes).
    """
    if cfg.env.remote is not None:
        return
    checked_arguments(cfg.env.id, cfg.env.kwargs)
    if cfg.env.eval_kwargs:
        checked_arguments(cfg.env.id, {**cfg.env.kwargs, **cfg.env.eval_kwargs})


def shortfall(cfg: TrainConfig, summary: dict[str, Any]) -> str | None:
    """Why a finished run failed, in one line, or None: it made fewer updates than ``run.updates``.

    A run stopped by Ctrl-C (``summary["interrupted"]``: its own exit status) is not judged here; one
    stopped by its time budget (``budget_spent``) fails only when it made no update at all.

    Args:
        cfg: The run's config (``run.updates``, ``run.batch_limit``).
        summary: :func:`agentenv.trainer.train.train`'s summary (``updates``, ``interrupted``, ``budget_spent``).
    """
    done, asked = int(summary.get("updates", 0)), cfg.run.updates
    if done >= asked or summary.get("interrupted") or (done > 0 and summary.get("budget_spent")):
        return None
    if summary.get("budget_spent"):
        why = "the time budget ran out before the first update"
    else:
        why = (f"the loop stopped after {cfg.run.batch_limit} batches (run.max_batches), most of them without "
               "gradient (every reward in the batch equal); more tokens or turns per episode (rollout.*), a "
               "larger run.batch_size or optim.step_on_zero_gradient=true change that")
    return f"made {done} of the {asked} updates asked for: {why}"


def default_env_kwargs(cfg: TrainConfig, renderer: ChatRenderer | None) -> dict[str, Any]:
    """Constructor arguments the trainer fills from the model: ``{"tool_parser": NAME}`` or ``{}``.

    ``NAME`` is ``renderer.tool_parser_name`` (the parser the chat template's call syntax implies,
    :func:`agentenv.rollout.tool_calls.parser_for_template`), given as
    :func:`agentenv.registration.tool_parser_argument` decides; a remote env (the server owns its
    arguments), no renderer, or a template that implies no parser give ``{}``.
    """
    from agentenv.registration import tool_parser_argument

    name = renderer.tool_parser_name if renderer is not None else None
    if cfg.env.remote is not None:
        return {}
    filled = tool_parser_argument(cfg.env.id, name, cfg.env.kwargs)
    if filled:
        logger.info("env %s: tool_parser=%r, from the model's chat template", cfg.env.id, name)
    return filled


def check_warmup(cfg: TrainConfig) -> None:
    """Refuse ``warmup.steps > 0`` for an env without scripted demonstrations (before a model loads).

    Raises:
        EnvNotFound / RegistrationError: ``env.id`` is not registered or cannot be imported.
        ConfigError: The env's entry point does not override
            :meth:`agentenv.core.Env.scripted_demonstrations`.
    """
    if cfg.warmup.steps > 0:
        _demonstrating_env(cfg)


def _demonstrating_env(cfg: TrainConfig) -> type[Env]:
    """The Env class of ``cfg.env.id``, which writes scripted demonstrations.

    Raises:
        EnvNotFound / RegistrationError: ``env.id`` is not registered or cannot be imported.
        ConfigError: The entry point is not an Env class overriding ``scripted_demonstrations``.
    """
    entry = spec(cfg.env.id).load()
    if not has_scripted_demonstrations(entry):
        raise ConfigError(f"warmup.steps={cfg.warmup.steps} needs scripted demonstrations, which environment "
                          f"{cfg.env.id!r} does not provide (Env.scripted_demonstrations); set warmup.steps=0")
    return entry


# -- model ----------------------------------------------------------------------------------------
def load_policy(
    cfg: TrainConfig, *, should_stop: Callable[[], bool] | None = None
) -> tuple[torch.nn.Module, Any, ChatRenderer]:
    """Load the policy and its tokenizer; apply the (cached) warm-up when ``warmup.steps > 0``.

    Raises:
        ConfigError: ``warmup.steps > 0`` for an env without scripted demonstrations (:func:`check_warmup`);
            a LoRA target the model does not have (before the warm-up; the message lists the ones it has).
        Interrupted: ``should_stop()`` became true during the warm-up (nothing is cached then).
    """
    from agentenv.models import load_model_and_tokenizer

    check_warmup(cfg)
    model, tokenizer = load_model_and_tokenizer(cfg.model.name, device=cfg.model.device)
    if cfg.learner.lora_rank:  # before the warm-up (minutes on a cache miss); the adapters come with the learner
        from agentenv.trainer.learners.lora import check_targets

        check_targets(model, cfg.learner.lora_target_modules)
    renderer = ChatRenderer(tokenizer, template_kwargs=dict(cfg.model.chat_template_kwargs))
    if cfg.warmup.steps > 0:
        model = warmed_up(cfg, model, tokenizer, renderer, should_stop=should_stop)
    model.eval()
    return model, tokenizer, renderer


def warmup_cache_key(cfg: TrainConfig, renderer: ChatRenderer) -> str:
    """The warm-up's cache key (12 hex digits): model, warm-up settings and the env's demonstrations.

    The env part is its ``demonstrations_tag`` (default: the entry point's qualified name;
    ``python_tool``'s is empty). What changes how the demonstrations render is in the key too, only
    when it is not the default, so that the CPU default's key stays the same: the chat-template
    variables (``model.chat_template_kwargs``) when any are set, and the tool-call family of the chat
    template (``renderer.tool_parser_name``) when it is one other than ``hermes`` (a template that
    implies none renders Hermes calls too).

    Args:
        cfg: The run's config.
        renderer: The policy's renderer, the one the demonstrations are rendered with.
    """
    entry = _demonstrating_env(cfg)
    tag = entry.demonstrations_tag
    if tag is None:
        tag = f"{entry.__module__}.{entry.__qualname__}"
    # the fixed count and seed are part of the key (in this order, the key of the configs that set them)
    settings = {**to_dict(cfg.warmup), "num_examples": WARMUP_EXAMPLES, "seed": WARMUP_SEED}
    parts: list[Any] = [cfg.model.name, settings, 3] + ([tag] if tag else [])
    if cfg.model.chat_template_kwargs:
        parts.append({"chat_template_kwargs": dict(cfg.model.chat_template_kwargs)})
    family = renderer.tool_parser_name
    if family not in (None, "hermes"):
        parts.append({"tool_call_family": family})
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:12]


def warmed_up(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, renderer: ChatRenderer, *,
              should_stop: Callable[[], bool] | None = None) -> torch.nn.Module:
    """The model after the supervised warm-up on the env's scripted demonstrations, cached.

    Computed once per :func:`warmup_cache_key`.

    Raises:
        Interrupted: ``should_stop()`` became true between two warm-up steps (nothing cached).
    """
    from agentenv.trainer.warmup import sft_warmup

    folder = cache_dir("warmup", warmup_cache_key(cfg, renderer))
    weights = folder / "model.pt"
    if weights.is_file():
        model.load_state_dict(torch.load(weights, map_location="cpu"))
        logger.info("warm-up loaded from cache %s", folder)
        return model
    encode = lambda s: tokenizer.encode(s, add_special_tokens=False)  # noqa: E731 (scripted text, not sampled)
    demos = _demonstrating_env(cfg).scripted_demonstrations(count=WARMUP_EXAMPLES, seed=WARMUP_SEED)
    examples = [render_demonstration(renderer, encode, d) for d in demos]
    t0 = time.time()
    bar = tqdm(total=cfg.warmup.steps, desc="warm-up", unit="step")

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


def build_learner(cfg: TrainConfig, model: torch.nn.Module) -> PolicyLearner:
    """The learner of ``cfg.learner.backend`` on ``model``.

    See :func:`agentenv.trainer.learners.backends.build_learner`.
    """
    from agentenv.trainer.learners.backends import build_learner as build

    return build(cfg, model, warmed_up=cfg.warmup.steps > 0)


def build_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any) -> GenerationEngine:
    """The generation engine the config names, serving ``model`` as policy version 0.

    Through :func:`agentenv.engines.build.build_engine`. vLLM takes ``model.memory_share`` of the GPU;
    by default 0.45 beside a learner on the same GPU (``learner.backend`` single or openrlhf), 0.9 when
    the learners run on other GPUs (``ray``), 0.2 of host memory on a CPU.

    Raises:
        ConfigError: vLLM asked for but not installed.
        EngineError: The engine failed to start.
    """
    from agentenv.engines.build import build_engine as build

    share = cfg.model.memory_share
    if share is None and torch.cuda.is_available():
        share = 0.9 if cfg.learner.backend == "ray" else 0.45
    return build(cfg.model.engine, model=model, tokenizer=tokenizer, seed=cfg.run.seed,
                 max_batch_size=cfg.model.max_batch_size, continuation=cfg.model.continuation, memory_share=share,
                 lora_rank=cfg.learner.lora_rank, lora_alpha=cfg.learner.lora_alpha)


@dataclass(frozen=True)
class LoopParts:
    """How :func:`agentenv.trainer.train.train` builds the parts of its loop, each from the run's config.

    Every field defaults to this module's builder of the config's part; a caller (a test, an
    experiment) passes its own to run the loop on a fake engine, a recording learner or a scripted
    environment, with everything else as a user's run has it.

    Attributes:
        load_policy: ``(cfg, should_stop=...) -> (model, tokenizer, renderer)``: the policy to train
            (:func:`load_policy`: the configured model after its cached warm-up).
        env_factory: ``(cfg, renderer=None) -> () -> Env``: builds the training environments; called
            once without a renderer to check the config before the model loads (:func:`env_factory`).
        build_learner: ``(cfg, model) -> PolicyLearner`` (:func:`build_learner`).
        build_engine: ``(cfg, model, tokenizer) -> engine`` serving ``model`` at version 0 (:func:`build_engine`).
        rebuild_engine: ``async (dead, learner, build) -> engine``: a fresh engine serving the learner's
            latest weights when one dies, ``build`` being ``model -> engine``
            (:func:`agentenv.engines.supervised.rebuild_from_learner`).
        sync_check: ``cfg -> SyncCheck | None``: the check that the engine samples the version it claims
            after each weight sync (:func:`agentenv.trainer.sync_check.sync_check`); a loop whose engine
            is scripted, not the learner's policy, passes ``lambda cfg: None``.
    """

    # looked up when a LoopParts is made, so a process that replaced a builder in this module gets it
    load_policy: Callable[..., tuple[torch.nn.Module, Any, ChatRenderer]] = field(default_factory=lambda: load_policy)
    env_factory: Callable[..., Callable[[], Env]] = field(default_factory=lambda: env_factory)
    build_learner: Callable[[TrainConfig, torch.nn.Module], PolicyLearner] = field(
        default_factory=lambda: build_learner)
    build_engine: Callable[[TrainConfig, torch.nn.Module, Any], GenerationEngine] = field(
        default_factory=lambda: build_engine)
    rebuild_engine: Callable[..., Awaitable[GenerationEngine]] = field(default_factory=lambda: rebuild_from_learner)
    sync_check: Callable[[TrainConfig], SyncCheck | None] = field(default_factory=lambda: sync_check)


# -- logging --------------------------------------------------------------------------------------
def progress_bar(total: int | None, initial: int) -> tqdm:
    """The run's progress bar (updates; ``total`` None: a count and a rate, no end, as under a time budget)."""
    return tqdm(total=total, initial=initial, desc="updates", unit="update", dynamic_ncols=True)


def turn_policy_tokens(traj: Trajectory) -> list[int]:
    """Policy tokens per reply: the segments that follow each other without environment tokens between.

    A weight update inside a reply splits it into segments that touch; a tool observation between two
    replies leaves a gap. ``[]`` for a trajectory without policy tokens.
    """
    out: list[int] = []
    for k, seg in enumerate(traj.segments):
        if k and seg.start == traj.segments[k - 1].end:
            out[-1] += seg.num_tokens
        else:
            out.append(seg.num_tokens)
    return out


def consumed_record(traj: Trajectory, version: int) -> dict[str, Any]:
    """One line of ``staleness.jsonl``: a trajectory's staleness when the learner at ``version`` used it.

    With its lengths (``policy_tokens``, ``turn_policy_tokens``: per reply, ``tokens``: the whole
    sequence), the versions at its start and completion and its start and completion ``time.time()``
    (seconds), from which ``agentenv simulate --from-run`` replays the run.
    """
    return {
        "id": traj.id, "task_id": traj.task_id, "version": version, "reward": traj.reward,
        "gs": traj.generation_staleness(), "ws": traj.waiting_staleness(version),
        "segments": len(traj.segments), "policy_tokens": traj.num_policy_tokens,
        "turns": traj.info.get("turns"), "tool_calls": traj.info.get("tool_calls"),
        "truncation": traj.info.get("truncation"),
        "turn_policy_tokens": turn_policy_tokens(traj),
        "tokens": len(traj.token_ids), "start_version": traj.start_version,
        "completion_version": traj.completion_version, "start_time": traj.start_time,
        "completion_time": traj.completion_time,
    }


def update_metrics(version: int, selection: BatchSelection, stats: UpdateStats, pool: TrajectoryPool,
                   collector: RolloutCollector, wait_s: float, update_s: float, t_start: float, *,
                   consumed_at: int | None = None) -> dict[str, Any]:
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
    # the share of the batch a token budget ended (per turn, total or context; info["truncation"])
    row["length/truncated"] = sum(is_token_budget_cut(t) for t in batch) / len(batch)
    row["tools/calls"] = sum(t.info.get("tool_calls", 0) or 0 for t in batch) / len(batch)
    # answers too expensive to verify, graded wrong (docs/grading.md, "Timeouts"; info["grading_timeout"])
    row["grading/timeouts"] = sum(bool(t.info.get("grading_timeout")) for t in batch)
    # turns whose observation the chat template could not render as an exact continuation
    row["chat/prefix_violations"] = sum(t.info.get("prefix_violations", 0) for t in batch)
    # agent programs (agentenv.agents) whose rewritten history broke the token prefix: new samples
    row["chat/history_rewrites"] = sum(t.info.get("history_rewrites", 0) for t in batch)
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
    (:mod:`agentenv.trainer.experiments.significance`). Reports without per-task outcomes, or of different
    task lists, give only ``eval/delta``.
    """
    from agentenv.trainer.experiments.significance import paired_bootstrap, two_proportion_interval

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
