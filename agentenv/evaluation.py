"""Evaluation: success rate of an agent on an environment's fixed tasks, e.g. ALFWorld seen / unseen.

Three layers, each usable alone:

* :func:`run_jobs` plays episode jobs concurrently on the asyncio loop with any *agent* (an async
  callable ``agent(env, job) -> EpisodeResult``): the model agent (:func:`model_agent`, the rollout
  loop with an engine), the walkthrough oracle, or a scripted agent in tests. ``concurrency``
  environments are built and reused, so at most that many games are live at once.
* :func:`aggregate` is a pure function from results to an :class:`EvalReport`: success rate overall
  and per task kind (ALFWorld: task type), mean steps, and pass@K over K samples per task (ALFWorld
  papers report the mean success over the episodes; with K = 3 samples per game as in the papers).
* :func:`write_report` and :func:`format_table` write and print it.

The ``agentenv eval`` command built on them is :mod:`agentenv.eval_command`.

"Game" in the names below is any task of the environment; "task type" is its kind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from agentenv.core import Env, TaskSet
from agentenv.errors import ConfigError

if TYPE_CHECKING:
    from agentenv.engines.base import GenerationEngine
    from agentenv.rollout.episode import Renderer, RolloutConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeJob:
    """One episode to play: task ``game_index`` of the environment's tasks, sample number ``sample``.

    Attributes:
        game_index: Index into the environment's :meth:`~agentenv.core.Env.tasks`
            (``reset(options={"task": i})``); None for an env without a task list, whose episode
            is chosen by ``reset_seed``.
        game: Task id (for the report; ``seed-<reset_seed>`` for a seed).
        task_type: Kind of the task (for the report).
        sample: 0..K-1, which of the K samples of this game.
        seed: Seed passed to ``env.reset`` (and so to the sampler through the rollout loop); with
            ``reset_seed`` set, the sampler's seed only.
        reset_seed: The seed that picks the episode of an env without a task list (``env.reset(seed=...)``).
        transcript: Keep the episode's transcript in the report.
    """

    game_index: int | None
    game: str
    task_type: str
    sample: int = 0
    seed: int = 0
    reset_seed: int | None = None
    transcript: bool = False


@dataclass(frozen=True)
class EpisodeResult:
    """The outcome of one episode.

    Attributes:
        game / task_type / sample: Copied from the job.
        won: The game was won (reward 1).
        reward: Episode return.
        steps: Game commands played (steps).
        seconds: Wall time of the episode (seconds).
        ending: Why it ended: ``"won"``, ``"lost"`` (terminated without a win), ``"truncated"`` (the
            env's step limit), a rollout budget (``"max_new_tokens_per_turn"``, ``"context"``, ...), or
            ``"error"``.
        error: ``"Type: message"`` when the episode failed (it then counts as not won), else None.
        answer: The answer the env read from the reply (``info["extracted_answer"]``), if it says.
        transcript: The whole episode as text, special tokens kept (only for jobs that ask for it).
    """

    game: str
    task_type: str
    sample: int
    won: bool
    reward: float
    steps: int
    seconds: float = 0.0
    error: str | None = None
    ending: str = ""
    answer: str | None = None
    transcript: str | None = None


Agent = Callable[[Env, EpisodeJob], Awaitable[EpisodeResult]]
#: A per-step policy: ``await policy(observation, info) -> reply``.
Policy = Callable[[str, Mapping[str, Any]], Awaitable[str]]


@dataclass(frozen=True)
class EvalConfig:
    """The held-out evaluation run before the first update and after the last one (``TrainConfig.eval``).

    ``agentenv eval`` takes its defaults for the temperature and the concurrency from here
    (:class:`agentenv.eval_command.EvalArgs`). Training plays each held-out task once (``agentenv eval
    --samples-per-game K`` samples K episodes per task). The held-out tasks are the first ``problems``
    of the held-out environment's :meth:`~agentenv.core.Env.tasks` (the env built with ``env.kwargs``
    updated by ``env.eval_kwargs``); choose ``eval_kwargs`` so that they never appear in training.
    """

    FIXED_FIELDS: ClassVar[dict[str, tuple[object, str]]] = {
        "samples_per_problem": (1, "training plays each held-out task once; agentenv eval --samples-per-game K")}

    problems: int = 0
    """Held-out tasks to evaluate on; 0 turns the evaluation off (needed for an env whose ``tasks()``
    is None)."""
    temperature: float = 0.0
    """Sampling temperature of the evaluation; 0 decodes greedily (one deterministic answer each)."""
    concurrency: int = 8
    """Episodes in flight during the evaluation."""

    def __post_init__(self) -> None:
        if self.problems < 0 or self.concurrency < 1:
            raise ConfigError("eval.problems must be >= 0; eval.concurrency >= 1")
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"eval.temperature must be a finite number >= 0, got {self.temperature}")


def make_jobs(
    games: Sequence[tuple[str, str]], *, samples_per_game: int = 1, limit: int | None = None, seed: int = 0,
    transcripts: int = 0,
) -> list[EpisodeJob]:
    """Jobs for the first ``limit`` games (all if None), ``samples_per_game`` each.

    Args:
        games: ``(name, task_type)`` of each game, in the environment's order.
        samples_per_game: K, episodes per game (K = 3 in the ALFWorld papers).
        limit: Play only the first ``limit`` games.
        seed: Base seed; job ``j`` gets ``seed + j``.
        transcripts: The first this many jobs keep their transcript.

    Raises:
        ConfigError: ``samples_per_game < 1`` or ``limit < 1``.
    """
    if samples_per_game < 1:
        raise ConfigError(f"samples_per_game must be >= 1, got {samples_per_game}")
    if limit is not None and limit < 1:
        raise ConfigError(f"limit must be >= 1, got {limit}")
    chosen = list(games)[: limit if limit is not None else None]
    jobs = []
    for i, (name, task_type) in enumerate(chosen):
        for k in range(samples_per_game):
            jobs.append(EpisodeJob(i, name, task_type, k, seed + len(jobs), transcript=len(jobs) < transcripts))
    return jobs


def seed_jobs(seeds: range, *, samples_per_game: int = 1, transcripts: int = 0) -> list[EpisodeJob]:
    """Jobs for an env without a task list: each seed of ``seeds`` is one game, ``samples_per_game`` each.

    Sample ``k`` of seed ``s`` resets the env with ``s`` and samples with seed ``s * 1009 + k``.

    Raises:
        ConfigError: ``samples_per_game < 1`` or an empty range.
    """
    if samples_per_game < 1:
        raise ConfigError(f"samples_per_game must be >= 1, got {samples_per_game}")
    if not len(seeds):
        raise ConfigError(f"--seeds {seeds.start}:{seeds.stop} is empty")
    jobs: list[EpisodeJob] = []
    for s in seeds:
        for k in range(samples_per_game):
            jobs.append(EpisodeJob(None, f"seed-{s}", "", k, s * 1009 + k, reset_seed=s,
                                   transcript=len(jobs) < transcripts))
    return jobs


def _failed(job: EpisodeJob, exc: BaseException, seconds: float) -> EpisodeResult:
    error = f"{type(exc).__name__}: {exc}"
    return EpisodeResult(job.game, job.task_type, job.sample, False, 0.0, 0, seconds, error, "error")


def _reset_args(job: EpisodeJob) -> dict[str, Any]:
    """``env.reset`` keywords of ``job``: its task index, or its seed for an env without a task list."""
    if job.game_index is None:
        return {"seed": job.reset_seed, "options": None}
    return {"seed": job.seed, "options": {"task": job.game_index}}


async def run_jobs(
    jobs: Sequence[EpisodeJob],
    agent: Agent,
    env_factory: Callable[[], Env],
    *,
    concurrency: int = 4,
    progress: bool = True,
    on_result: Callable[[EpisodeResult], None] | None = None,
) -> list[EpisodeResult]:
    """Play ``jobs`` with ``concurrency`` environments at once; results come back in job order.

    An agent or environment that raises fails only its own episode (recorded with ``error``).

    Args:
        jobs: Episodes to play.
        agent: Plays one job on a given (reusable) environment.
        env_factory: Builds one environment; called ``min(concurrency, len(jobs))`` times.
        concurrency: Environments (live games) at once.
        progress: Show a tqdm progress bar on stderr.
        on_result: Called with each result as it completes.

    Raises:
        ConfigError: ``concurrency < 1``.
    """
    if concurrency < 1:
        raise ConfigError(f"concurrency must be >= 1, got {concurrency}")
    from tqdm import tqdm

    results: list[EpisodeResult | None] = [None] * len(jobs)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(jobs)):
        queue.put_nowait(i)
    bar = tqdm(total=len(jobs), desc="episodes", unit="ep", disable=not progress, file=sys.stderr)
    wins = done = 0

    async def worker() -> None:
        nonlocal wins, done
        env = env_factory()
        try:
            while not queue.empty():
                i = queue.get_nowait()
                start = time.perf_counter()
                try:
                    res = await agent(env, jobs[i])
                except Exception as exc:  # one broken episode never stops the run
                    res = _failed(jobs[i], exc, time.perf_counter() - start)
                    logger.warning("episode %s#%d failed: %s", jobs[i].game, jobs[i].sample, res.error)
                results[i] = res
                wins, done = wins + res.won, done + 1
                bar.update(1)
                bar.set_postfix(success=f"{wins / done:.3f}", refresh=False)
                if on_result:
                    on_result(res)
        finally:
            await env.close()

    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(jobs)))))
    finally:
        bar.close()
    return [r for r in results if r is not None]


def policy_agent(make_policy: Callable[[EpisodeJob, Mapping[str, Any]], Policy]) -> Agent:
    """An agent that resets the env to the job's task and steps it with a per-step policy.

    Args:
        make_policy: ``make_policy(job, reset_info)`` returns the episode's policy.
    """

    async def agent(env: Env, job: EpisodeJob) -> EpisodeResult:
        start = time.perf_counter()
        obs, info = await env.reset(**_reset_args(job))
        policy = make_policy(job, info)
        total, steps, won = 0.0, 0, False
        while True:
            result = await env.step(await policy(obs, info))
            obs, info = result.observation, dict(result.info)
            total += float(result.reward)
            steps = int(info.get("steps", steps + 1))
            won = bool(info.get("won", result.reward > 0))
            if result.terminated or result.truncated:
                break
        ending = "won" if won else ("lost" if result.terminated else "truncated")
        return EpisodeResult(
            job.game, job.task_type, job.sample, won, total, steps, time.perf_counter() - start, None, ending
        )

    return agent


def model_agent(engine: GenerationEngine, renderer: Renderer, cfg: RolloutConfig) -> Agent:
    """An agent that plays with a language model through ``agentenv.rollout.episode.run_episode``.

    Args:
        engine: A :class:`~agentenv.engines.base.GenerationEngine`.
        renderer: The chat renderer of the engine's tokenizer.
        cfg: An ``agentenv.rollout.episode.RolloutConfig`` (its ``max_turns`` should cover the env's steps).

    An episode is won when ``info["won"]`` says so or, for envs that do not report it, when its
    reward is positive; its steps are ``info["steps"]``, else the assistant turns. Its answer is
    ``info["extracted_answer"]``; a job with ``transcript`` keeps the decoded episode.
    """
    from agentenv.rollout.episode import run_episode

    async def agent(env: Env, job: EpisodeJob) -> EpisodeResult:
        start = time.perf_counter()
        reset = _reset_args(job)
        sampling_seed = job.seed if job.game_index is None else None
        traj = await run_episode(env, engine, renderer, cfg, **reset, sampling_seed=sampling_seed)
        info = traj.info
        won = bool(info.get("won", traj.reward > 0)) and traj.status != "error"
        trunc = info.get("truncation")
        if traj.status == "error" or won:
            ending = "error" if traj.status == "error" else "won"
        else:
            ending = "truncated" if trunc == "env" else str(trunc or "lost")
        return EpisodeResult(
            job.game,
            job.task_type,
            job.sample,
            won=won,
            reward=float(traj.reward),
            steps=int(info.get("steps", info.get("turns", 0))),
            seconds=time.perf_counter() - start,
            error=info.get("error") if traj.status == "error" else None,
            ending=ending,
            answer=None if info.get("extracted_answer") is None else str(info["extracted_answer"]),
            transcript=renderer.decode(traj.token_ids, keep_special=True) if job.transcript else None,
        )

    return agent


@dataclass(frozen=True)
class TaskStats:
    """Figures of one group of episodes (all, or one task kind).

    Attributes:
        games: Distinct tasks.
        episodes: Episodes played (games x samples).
        successes: Episodes won.
        success_rate: successes / episodes, in [0, 1] (NaN when no episode).
        pass_at_k: Share of games won in at least one of their samples, in [0, 1].
        mean_steps: Mean steps per episode (steps).
        mean_steps_won: Mean steps of won episodes (NaN when none was won).
        errors: Episodes that failed with an error (counted as not won).
        endings: Why the episodes ended (:attr:`EpisodeResult.ending`) -> episodes, most frequent first.
    """

    games: int
    episodes: int
    successes: int
    success_rate: float
    pass_at_k: float
    mean_steps: float
    mean_steps_won: float
    errors: int
    endings: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class EvalReport:
    """What ``agentenv eval`` reports.

    Attributes:
        env / split / model: What was evaluated (``split``: the env's ``split`` attribute, else ``""``).
        samples_per_game: K.
        overall: Figures over all episodes.
        per_task: Task kind (ALFWorld: task type) -> figures, in ``task_order`` then alphabetical order.
        seconds: Wall time of the run (seconds).
        episodes_per_minute: Throughput (episodes / minute).
        protocol: How the episodes were played (sampling, samples, turn and token limits, tasks or
            seeds): ``agentenv eval`` fills it (:func:`protocol`); empty when not stated.
    """

    env: str
    split: str
    model: str
    samples_per_game: int
    overall: TaskStats
    per_task: dict[str, TaskStats] = field(default_factory=dict)
    seconds: float = 0.0
    episodes_per_minute: float = 0.0
    protocol: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (NaN written as null)."""

        def clean(x: Any) -> Any:
            if isinstance(x, float) and math.isnan(x):
                return None
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            return x

        return clean(asdict(self))


def _stats(results: Sequence[EpisodeResult]) -> TaskStats:
    n = len(results)
    wins = sum(r.won for r in results)
    by_game: dict[str, bool] = {}
    for r in results:
        by_game[r.game] = by_game.get(r.game, False) or r.won
    won_steps = [r.steps for r in results if r.won]
    nan = float("nan")
    return TaskStats(
        games=len(by_game),
        episodes=n,
        successes=wins,
        success_rate=wins / n if n else nan,
        pass_at_k=sum(by_game.values()) / len(by_game) if by_game else nan,
        mean_steps=sum(r.steps for r in results) / n if n else nan,
        mean_steps_won=sum(won_steps) / len(won_steps) if won_steps else nan,
        errors=sum(r.error is not None for r in results),
        endings=dict(Counter(r.ending or "?" for r in results).most_common()),
    )


def aggregate(
    results: Sequence[EpisodeResult],
    *,
    env: str = "alfworld",
    split: str = "",
    model: str = "",
    samples_per_game: int = 1,
    task_order: Sequence[str] = (),
    seconds: float = 0.0,
    protocol: Mapping[str, Any] | None = None,
) -> EvalReport:
    """Summarise episode results (pure: no I/O).

    Args:
        results: One entry per episode.
        env: Environment id, copied into the report.
        split: Split name, copied into the report.
        model: Model label, copied into the report.
        samples_per_game: K, copied into the report.
        task_order: Task types to list first, in this order, even when no episode has them.
        seconds: Wall time of the run, for the throughput.
        protocol: How the episodes were played, copied into the report.
    """
    types = list(task_order) + sorted({r.task_type for r in results} - set(task_order))
    per_task = {t: _stats([r for r in results if r.task_type == t]) for t in types}
    return EvalReport(
        env=env,
        split=split,
        model=model,
        samples_per_game=samples_per_game,
        overall=_stats(results),
        per_task=per_task,
        seconds=seconds,
        episodes_per_minute=60.0 * len(results) / seconds if seconds > 0 else 0.0,
        protocol=dict(protocol or {}),
    )


def format_table(report: EvalReport) -> str:
    """The report as a fixed-width text table."""

    def pct(x: float) -> str:
        return "    -" if math.isnan(x) else f"{100 * x:5.1f}"

    def num(x: float) -> str:
        return "    -" if math.isnan(x) else f"{x:5.1f}"

    head = (
        f"{'kind':<24} {'tasks':>5} {'eps':>5} {'won':>5} {'succ%':>6} {'pass@k%':>7} {'steps':>6} "
        f"{'err':>4}"
    )
    rows = [
        f"{report.env} {report.split}  model={report.model or '-'}  K={report.samples_per_game}",
        head,
        "-" * len(head),
    ]

    def row(name: str, s: TaskStats) -> str:
        return (
            f"{name:<24} {s.games:>5} {s.episodes:>5} {s.successes:>5} {pct(s.success_rate):>6} "
            f"{pct(s.pass_at_k):>7} {num(s.mean_steps):>6} {s.errors:>4}"
        )

    rows += [row(t or "(no kind)", s) for t, s in report.per_task.items()]
    rows += ["-" * len(head), row("overall", report.overall)]
    ended = ", ".join(f"{n} {why}" for why, n in report.overall.endings.items())
    rows.append(f"episodes ended: {ended or '-'}")
    if report.protocol:
        rows.append("protocol: " + ", ".join(f"{k}={v}" for k, v in report.protocol.items()))
    rows.append(f"{report.seconds:.1f} s, {report.episodes_per_minute:.1f} episodes/min")
    return "\n".join(rows)


def write_report(report: EvalReport, results: Sequence[EpisodeResult], out: Path) -> Path:
    """Write ``report.json`` (the report plus every episode) and ``report.txt`` into folder ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    payload = report.to_json() | {"complete": True, "episodes": [asdict(r) for r in results]}
    (out / "report.json").write_text(json.dumps(payload, indent=2) + "\n")
    (out / "report.txt").write_text(format_table(report) + "\n")
    return out / "report.json"


async def env_tasks(env_id: str, kwargs: Mapping[str, Any], *, remedy: str = "there is nothing to evaluate"
                    ) -> tuple[Callable[[], Env], TaskSet, str]:
    """The builder of ``make(env_id, **kwargs)``, its tasks and its split label (``env.split`` or ``""``).

    One environment is built and closed to read its :meth:`~agentenv.core.Env.tasks`; ``remedy``
    ends the error message when it declares none (what the caller cannot do, or what to change).

    Raises:
        EnvNotFound / RegistrationError: Unknown or broken environment.
        ConfigError: A constructor argument it does not take (the message lists the ones it takes),
            or an env that declares no tasks (``tasks()`` is None) or none at all.
        DataError: The env's tasks cannot be read.
    """
    from agentenv.registration import make

    async with make(env_id, **kwargs) as env:
        tasks, split = env.tasks(), env.split
    if tasks is None or not len(tasks):
        raise ConfigError(f"environment {env_id!r} declares no fixed tasks (Env.tasks), so {remedy}")
    return (lambda: make(env_id, **kwargs)), tasks, split
