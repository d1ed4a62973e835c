"""Evaluation: success rate of an agent on an environment's fixed tasks, e.g. ALFWorld seen / unseen.

Three layers, each usable alone:

* :func:`run_jobs` plays episode jobs concurrently on the asyncio loop with any *agent* (an async
  callable ``agent(env, job) -> EpisodeResult``): the model agent (:func:`model_agent`, the rollout
  loop with an engine), the walkthrough oracle, or a scripted agent in tests. ``concurrency``
  environments are built and reused, so at most that many games are live at once.
* :func:`aggregate` is a pure function from results to an :class:`EvalReport`: success rate overall
  and per task kind (ALFWorld: task type), mean steps, and pass@K over K samples per task (ALFWorld
  papers report the mean success over the episodes; with K = 3 samples per game as in the papers).
* :func:`main` is ``agentenv eval``: for any environment ``agentenv envs`` lists, it loads the model
  and engine, plays the env's tasks (:meth:`agentenv.core.Env.tasks`) or, for an env without a task
  list, a range of seeds, under a stated protocol (:func:`protocol`; by default the trainer's
  held-out one: greedy, one sample); each episode is logged as it ends (:class:`EpisodeLog`,
  ``--resume``), then the table is printed and the report written as JSON and text.

"Game" in the names below is any task of the environment; "task type" is its kind.
"""

from __future__ import annotations

import argparse
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
from typing import Any

from agentenv.core import Env, TaskSet
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.output_folders import EVALUATION, claim_folder

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


def model_agent(engine: Any, renderer: Any, cfg: Any) -> Agent:
    """An agent that plays with a language model through ``agentenv.rollout.run_episode``.

    Args:
        engine: A :class:`~agentenv.engines.base.GenerationEngine`.
        renderer: The chat renderer of the engine's tokenizer.
        cfg: An ``agentenv.rollout.RolloutConfig`` (its ``max_turns`` should cover the env's steps).

    An episode is won when ``info["won"]`` says so or, for envs that do not report it, when its
    reward is positive; its steps are ``info["steps"]``, else the assistant turns. Its answer is
    ``info["extracted_answer"]``; a job with ``transcript`` keeps the decoded episode.
    """
    from agentenv.rollout import run_episode

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


# -- the command ---------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentenv eval",
        description="Evaluate a model on an environment: its fixed tasks (default: ALFWorld seen games), or a "
                    "range of seeds for an env without a task list. By default the trainer's held-out protocol: "
                    "greedy, one sample per task, the env's own turn limit.",
    )
    p.add_argument("--env", default="alfworld", help="environment id (`agentenv envs`)")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a constructor argument of the environment (VALUE read as YAML); repeat for more")
    p.add_argument("--chat-template-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="a variable of the model's chat template (VALUE read as YAML), e.g. enable_thinking=false "
                        "for Qwen3's thinking-off mode; repeat for more")
    p.add_argument("--split", default=None, help="shorthand for --env-arg split=SPLIT (ALFWorld: valid_seen, "
                   "140 games, the default; valid_unseen, 134)")
    p.add_argument("--model", default=None, help="model folder, e.g. one `agentenv export` wrote (default: the "
                   "embedded SmolLM2-135M)")
    p.add_argument("--engine", default="transformers", choices=["transformers", "vllm"])
    p.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM memory share (default 0.9 GPU, 0.2 CPU)",
    )
    p.add_argument("--samples-per-game", type=int, default=1, help="K episodes per task (default 1; the ALFWorld "
                   "papers sample 3 at temperature 1.0)")
    p.add_argument("--limit", type=int, default=None, help="play only the first N tasks")
    p.add_argument("--seeds", default=None, metavar="A:B", help="seeds A..B-1, one episode each, for an env "
                   f"without a task list (default {DEFAULT_SEEDS.start}:{DEFAULT_SEEDS.stop}: training plays "
                   "seeds run.seed*1000003 upwards, so these are not among them)")
    p.add_argument("--concurrency", type=int, default=4, help="episodes played at once")
    p.add_argument("--max-steps", type=int, default=None, help="turns per episode, also passed as the env's own "
                   "max_steps or max_turns argument when its constructor takes one (unless --env-arg sets it); "
                   f"default: the env's own limit, and at most {DEFAULT_MAX_STEPS} turns")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="tokens per reply (default %(default)s)")
    p.add_argument("--max-total-tokens", type=int, default=None, help="tokens per episode after the prompt "
                   "(default: what the model's context holds)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy, as the trainer's held-out "
                   "evaluation; above 0: sampled")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-root", default=None, help="shorthand for --env-arg data_root=PATH (ALFWorld: the "
                   "alfworld data folder, default <data>/alfworld)")
    p.add_argument("--transcripts", type=int, default=10, help="keep the transcript of the first N episodes in "
                   "report.json (default %(default)s)")
    p.add_argument("--out", default="runs/eval", help="folder for report.json, report.txt and episodes.jsonl")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier evaluation in --out (never a "
                   "folder that is not one)")
    p.add_argument("--resume", action="store_true", help="continue the evaluation in --out: play only the "
                   "episodes it has not recorded (the same protocol)")
    p.add_argument("--no-progress", action="store_true")
    return p


#: Seeds ``agentenv eval`` plays an env without a task list when ``--seeds`` is not given: disjoint from
#: training's (a run with ``run.seed = s`` plays seeds from ``s * 1,000,003`` upwards).
DEFAULT_SEEDS = range(2_000_000_000, 2_000_000_020)
#: Tokens per reply when ``--max-new-tokens`` is not given.
DEFAULT_MAX_NEW_TOKENS = 256


def parse_seeds(text: str) -> range:
    """``"A:B"`` -> ``range(A, B)``.

    Raises:
        ConfigError: Not two integers ``0 <= A < B`` separated by ``:``.
    """
    a, colon, b = text.partition(":")
    try:
        seeds = range(int(a), int(b))
    except ValueError:
        seeds = None
    if not colon or seeds is None or seeds.start < 0 or not len(seeds):
        raise ConfigError(f"--seeds {text!r}: expected A:B with 0 <= A < B")
    return seeds


#: Constructor arguments that bound an episode's length; ``--max-steps`` sets the first one an env takes.
TURN_LIMIT_ARGS = ("max_steps", "max_turns")
#: Turns an episode may take when ``--max-steps`` is not given (ALFWorld's 50 steps): an env's own,
#: smaller limit ends it first.
DEFAULT_MAX_STEPS = 50


def env_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The environment's constructor arguments from ``--env-arg``, ``--split``, ``--data-root`` and ``--max-steps``.

    ``--env-arg KEY=VALUE`` values are read as YAML (``3`` an int, ``true`` a bool, ``a`` a string);
    ``--max-steps``, when given, fills the first of :data:`TURN_LIMIT_ARGS` the constructor takes (unless an
    ``--env-arg`` sets it); without it the env keeps its own default limit.

    Raises:
        ConfigError: An ``--env-arg`` without ``=`` or with an empty key.
        EnvNotFound: ``--env`` is not registered.
    """
    import yaml

    from agentenv.registration import constructor_parameters, spec

    kwargs: dict[str, Any] = {}
    for item in args.env_arg:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--env-arg {item!r}: expected KEY=VALUE")
        kwargs[key.strip()] = yaml.safe_load(value)
    for key, value in (("split", args.split), ("data_root", args.data_root)):
        if value is not None:
            kwargs[key] = value
    accepted = constructor_parameters(spec(args.env).load()) or ()
    limit = next((k for k in TURN_LIMIT_ARGS if k in accepted), None)
    if limit is not None and args.max_steps is not None:
        kwargs.setdefault(limit, args.max_steps)
    return kwargs


def template_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The chat template's extra variables from ``--chat-template-kwarg KEY=VALUE`` (VALUE read as YAML).

    Raises:
        ConfigError: An item without ``=`` or with an empty key.
    """
    import yaml

    out: dict[str, Any] = {}
    for item in args.chat_template_kwarg:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"--chat-template-kwarg {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _build_engine(args: argparse.Namespace) -> tuple[Any, Any]:
    """Load the model and return ``(engine, renderer)``: vLLM, or transformers (GPU if there is one)."""
    import torch

    from agentenv.chat import ChatRenderer
    from agentenv.models import DEFAULT_ALIASES, chat_template, load_model_and_tokenizer, resolve_model_path

    if args.engine == "vllm":
        from transformers import AutoTokenizer

        from agentenv.engines.vllm_engine import VLLMEngine

        path = resolve_model_path(args.model)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if args.model is None or str(args.model) in DEFAULT_ALIASES:
            tokenizer.chat_template = chat_template()
        gpu = torch.cuda.is_available()
        # On a CPU, vLLM's "gpu_memory_utilization" is the share of host memory it reserves for KV.
        util = args.gpu_memory_utilization or (0.9 if gpu else 0.2)
        engine = VLLMEngine(
            path, dtype="bfloat16" if gpu else "auto", seed=args.seed, gpu_memory_utilization=util
        )
        return engine, ChatRenderer(tokenizer, template_kwargs=template_kwargs(args))
    from agentenv.engines.transformers_engine import TransformersEngine

    gpu = torch.cuda.is_available()
    model, tokenizer = load_model_and_tokenizer(
        args.model, dtype=torch.bfloat16 if gpu else torch.float32, device="cuda" if gpu else "cpu"
    )
    return TransformersEngine(model, tokenizer, seed=args.seed), ChatRenderer(tokenizer,
                                                                             template_kwargs=template_kwargs(args))


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
        tasks, split = env.tasks(), str(getattr(env, "split", ""))
    if tasks is None or not len(tasks):
        raise ConfigError(f"environment {env_id!r} declares no fixed tasks (Env.tasks), so {remedy}")
    return (lambda: make(env_id, **kwargs)), tasks, split


def refuse_checkpoint(model: str | None) -> None:
    """Refuse a training checkpoint folder (``RUN/checkpoints/vN``) as ``--model``, naming the export that fixes it.

    Raises:
        ConfigError: ``model`` holds a checkpoint's ``meta.json`` and no ``config.json``.
    """
    if model is None:
        return
    folder = Path(model)
    if (folder / "meta.json").is_file() and not (folder / "config.json").is_file():
        run = folder.parent.parent if folder.parent.name == "checkpoints" else Path("RUN")
        raise ConfigError(f"{folder} is a training checkpoint (weights and optimizer, no config or tokenizer); "
                          f"export it as a model folder first: agentenv export {run} --out MODEL_DIR, then "
                          "--model MODEL_DIR")


def protocol(args: argparse.Namespace, kwargs: Mapping[str, Any], tasks: str) -> dict[str, Any]:
    """How ``agentenv eval`` plays its episodes, as written in the report (and compared by ``--resume``)."""
    sampling = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}, top_p {args.top_p}"
    return {"sampling": sampling, "samples_per_task": args.samples_per_game, "tasks": tasks,
            "max_turns": args.max_steps or DEFAULT_MAX_STEPS, "max_new_tokens_per_turn": args.max_new_tokens,
            "max_total_tokens": args.max_total_tokens or "model context", "seed": args.seed,
            "env_kwargs": json.loads(json.dumps(dict(kwargs), default=str))}


class EpisodeLog:
    """``--out``'s files while an evaluation runs: ``episodes.jsonl`` gets each episode as it ends.

    ``report.json`` holds the protocol (and so marks the folder as an evaluation's) from the start; the
    full report replaces it at the end (:func:`write_report`).
    """

    def __init__(self, out: Path, proto: dict[str, Any], *, resume: bool) -> None:
        """Open the log; with ``resume`` read the episodes recorded under the same protocol.

        Raises:
            ConfigError: ``resume`` and the recorded protocol differs (the message names the fields).
        """
        self.path, self.done = out / "episodes.jsonl", []
        report = out / "report.json"
        if resume and report.is_file():
            held = json.loads(report.read_text()).get("protocol", {})
            changed = sorted(k for k in set(held) | set(proto) if held.get(k) != proto.get(k))
            if changed:
                diff = "; ".join(f"{k}: {held.get(k)!r} then, {proto.get(k)!r} now" for k in changed)
                raise ConfigError(f"--resume: {out} was evaluated with another protocol ({diff}); "
                                  "pass --overwrite to start again")
            if self.path.is_file():
                fields = set(EpisodeResult.__dataclass_fields__)
                self.done = [EpisodeResult(**{k: v for k, v in json.loads(line).items() if k in fields})
                             for line in self.path.read_text().splitlines() if line.strip()]
        else:
            self.path.write_text("")
            report.write_text(json.dumps({"protocol": proto, "complete": False}, indent=2) + "\n")
        self._file = self.path.open("a")

    def keys(self) -> set[tuple[str, int]]:
        """``(game, sample)`` of the episodes already recorded."""
        return {(r.game, r.sample) for r in self.done}

    def add(self, result: EpisodeResult) -> None:
        """Append one episode (flushed: a Ctrl-C or a kill loses at most the episodes still running)."""
        self._file.write(json.dumps(asdict(result)) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def all_failed(results: Sequence[EpisodeResult]) -> str | None:
    """A one-line reason when every episode ended in an error (the evaluation measured nothing), else None."""
    if not results or any(r.error is None for r in results):
        return None
    return f"all {len(results)} episodes failed (the first: {results[0].error})"


async def _run(args: argparse.Namespace) -> tuple[EvalReport, list[EpisodeResult], Path]:
    from agentenv.registration import make
    from agentenv.rollout import RolloutConfig

    template_kwargs(args)  # a malformed --chat-template-kwarg fails before anything loads
    refuse_checkpoint(args.model)
    kwargs = env_kwargs(args)
    async with make(args.env, **kwargs) as env:
        tasks, split = env.tasks(), str(getattr(env, "split", ""))
    if tasks is not None and len(tasks) and args.seeds is None:
        jobs = make_jobs(list(zip(tasks.ids, tasks.kinds, strict=True)), samples_per_game=args.samples_per_game,
                         limit=args.limit, seed=args.seed, transcripts=args.transcripts)
        shown = f"first {len(jobs) // args.samples_per_game} of {len(tasks)} tasks"
        kinds = list(dict.fromkeys(tasks.kinds))
    else:
        seeds = parse_seeds(args.seeds) if args.seeds else DEFAULT_SEEDS
        jobs = seed_jobs(seeds, samples_per_game=args.samples_per_game, transcripts=args.transcripts)
        shown, kinds = f"seeds {seeds.start}:{seeds.stop}", [""]
    proto = protocol(args, kwargs, shown)
    out = claim_folder(args.out, EVALUATION, overwrite=args.overwrite, resume=args.resume)  # input checked first
    log = EpisodeLog(out, proto, resume=args.resume)
    done = log.keys()
    todo = [j for j in jobs if (j.game, j.sample) not in done]
    if done:
        print(f"agentenv eval: {len(jobs) - len(todo)} of {len(jobs)} episodes recorded before; playing the "
              f"other {len(todo)}", file=sys.stderr)
    start = time.perf_counter()
    try:
        new: list[EpisodeResult] = []
        if todo:
            engine, renderer = _build_engine(args)
            cfg = RolloutConfig(
                max_turns=args.max_steps or DEFAULT_MAX_STEPS,
                max_new_tokens_per_turn=args.max_new_tokens,
                max_total_tokens=args.max_total_tokens or engine.max_context_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
            )
            try:
                new = await run_jobs(todo, model_agent(engine, renderer, cfg), lambda: make(args.env, **kwargs),
                                     concurrency=args.concurrency, progress=not args.no_progress,
                                     on_result=log.add)
            finally:
                await engine.close()
    finally:
        log.close()
    order = {(j.game, j.sample): i for i, j in enumerate(jobs)}
    results = sorted([*log.done, *new], key=lambda r: order.get((r.game, r.sample), len(order)))
    report = aggregate(
        results,
        env=args.env,
        split=split,
        model=args.model or "SmolLM2-135M (embedded)",
        samples_per_game=args.samples_per_game,
        task_order=kinds,  # every kind of the env, in task order
        seconds=time.perf_counter() - start,
        protocol=proto,
    )
    return report, results, out


def main(argv: Sequence[str] | None = None) -> int:
    """``agentenv eval``: print and write the success-rate report; return the exit status.

    0: the report is written; 1: every episode failed (the report is written too); 2: bad input or a
    folder that is not an evaluation's; 130: Ctrl-C (the episodes that ended are in ``episodes.jsonl``:
    ``--resume`` continues).

    Examples: ``agentenv eval --env alfworld --split valid_unseen --model PATH``;
    ``agentenv eval --env examples/GuessNumber-v0 --env-arg high=20``;
    ``agentenv eval --env reasoning_gym/gcd --seeds 0:50 --temperature 1.0 --samples-per-game 3``.
    """
    args = _parser().parse_args(argv)
    try:
        report, results, out = asyncio.run(_run(args))
    except AgentEnvError as exc:
        print(f"agentenv eval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nagentenv eval: stopped; the episodes that ended are in {Path(args.out) / 'episodes.jsonl'} "
              "(the same command with --resume plays the rest)", file=sys.stderr)
        return 130
    print(format_table(report))
    path = write_report(report, results, out)
    print(f"report written to {path}")
    if (failed := all_failed(results)) is not None:
        print(f"agentenv eval: {failed}", file=sys.stderr)
        return 1
    return 0
