"""The walkthrough oracle: replays each game's stored walkthrough; it must win every game.

It checks the whole stack (game files, TextWorld, wrappers, the environment, the concurrent
evaluation runner) without a model: 140/140 seen and 134/134 unseen wins (docs/architecture.md, "Data").
Games run in ``workers`` processes (a reset costs about a second of CPU, and threads share one GIL),
each playing its share through :func:`agentenv.evaluation.run_jobs`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from agentenv.envs.alfworld.env import AlfWorldEnv
from agentenv.envs.alfworld.games import TASK_TYPES, GameRef, canonical_split, list_games, read_game
from agentenv.errors import AgentEnvError
from agentenv.evaluation import (
    EpisodeJob,
    EpisodeResult,
    EvalReport,
    Policy,
    aggregate,
    format_table,
    make_jobs,
    policy_agent,
    run_jobs,
    write_report,
)
from agentenv.output_folders import EVALUATION, claim_folder


@dataclass(frozen=True)
class OracleOptions:
    """What ``agentenv alfworld-oracle`` replays and where it writes (its flags, read with tyro)."""

    split: str = "valid_seen"
    """``valid_seen``, ``valid_unseen`` (or ``seen``, ``unseen``) or ``train``."""
    limit: int | None = None
    """Only the first ``limit`` games of the split."""
    workers: int = 2
    """Processes (1 plays in this process)."""
    concurrency: int = 2
    """Games at once in each process."""
    max_steps: int = 50
    """Step limit per episode."""
    data_root: str | None = None
    """The ``alfworld`` data folder (default: ``alfworld`` in the shared data folder, ``$AGENTENV_DATA``)."""
    out: str | None = None
    """Folder for report.json / report.txt (new, empty, or an evaluation folder with ``--overwrite``)."""
    overwrite: bool = False
    """Replace the evaluation report in ``--out``."""
    no_progress: bool = False
    """No progress bar."""


def walkthrough_policy(games: Sequence[GameRef]) -> Any:
    """``make_policy`` for :func:`~agentenv.evaluation.policy_agent` replaying each game's walkthrough.

    After the walkthrough runs out it answers ``look`` (which never wins), so a broken game shows as
    a loss after ``max_steps``, not as a hang.
    """

    def make_policy(job: EpisodeJob, info: Mapping[str, Any]) -> Policy:
        commands = iter(read_game(games[job.game_index].path)["walkthrough"])

        async def policy(obs: str, info: Mapping[str, Any]) -> str:
            return next(commands, "look")

        return policy

    return make_policy


def _play_chunk(
    games: list[GameRef], jobs: list[EpisodeJob], concurrency: int, max_steps: int
) -> list[EpisodeResult]:
    """Play ``jobs`` in this process (the body of one worker process)."""
    agent = policy_agent(walkthrough_policy(games))
    return asyncio.run(
        run_jobs(
            jobs,
            agent,
            lambda: AlfWorldEnv(games=games, max_steps=max_steps),
            concurrency=concurrency,
            progress=False,
        )
    )


def run_oracle(
    split: str,
    *,
    limit: int | None = OracleOptions.limit,
    workers: int = OracleOptions.workers,
    concurrency: int = OracleOptions.concurrency,
    max_steps: int = OracleOptions.max_steps,
    data_root: str | None = OracleOptions.data_root,
    progress: bool = True,
) -> tuple[EvalReport, list[EpisodeResult]]:
    """Replay the walkthroughs of ``split`` and report.

    Args:
        split: ``valid_seen``, ``valid_unseen`` or ``train``.
        limit: Only the first ``limit`` games.
        workers: Processes (1 plays in this process).
        concurrency: Games at once in each process.
        max_steps: Step limit per episode.
        data_root: The ``alfworld`` data folder.
        progress: Show a progress bar.

    Raises:
        DataError: Unknown split or unreadable data folder.
    """
    from tqdm import tqdm

    split = canonical_split(split)
    games = list_games(split, data_root)
    jobs = make_jobs([(g.name, g.task_type) for g in games], limit=limit)
    start = time.perf_counter()
    if workers <= 1:
        results = asyncio.run(
            run_jobs(
                jobs,
                policy_agent(walkthrough_policy(games)),
                lambda: AlfWorldEnv(games=games, max_steps=max_steps),
                concurrency=concurrency,
                progress=progress,
            )
        )
    else:
        size = max(1, min(16, len(jobs) // (4 * workers) or 1))
        chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        by_game: dict[tuple[str, int], EpisodeResult] = {}
        ctx = multiprocessing.get_context("spawn")
        with (
            ProcessPoolExecutor(workers, mp_context=ctx) as pool,
            tqdm(total=len(jobs), desc="oracle", unit="game", disable=not progress, file=sys.stderr) as bar,
        ):
            futures = [pool.submit(_play_chunk, games, c, concurrency, max_steps) for c in chunks]
            for fut in as_completed(futures):
                for r in fut.result():
                    by_game[(r.game, r.sample)] = r
                    bar.update(1)
        results = [by_game[(j.game, j.sample)] for j in jobs]
    report = aggregate(
        results,
        split=split,
        model="walkthrough oracle",
        task_order=list(TASK_TYPES.values()),
        seconds=time.perf_counter() - start,
    )
    return report, results


def oracle_main(argv: Sequence[str] | None = None) -> int:
    """``agentenv alfworld-oracle [--split valid_seen] [...]``: the :class:`OracleOptions` flags.

    Returns:
        0 when every game is won, 1 otherwise, 2 on bad input (a flag that does not parse, an unknown
        split, missing data, an ``--out`` folder that is not an evaluation's).
    """
    from agentenv.cli_args import parse

    args = parse(OracleOptions, sys.argv[1:] if argv is None else argv, prog="agentenv alfworld-oracle",
                 description="Replay the ALFWorld walkthroughs: every game must be won.")
    if isinstance(args, int):
        return args
    try:
        out = claim_folder(args.out, EVALUATION, overwrite=args.overwrite) if args.out else None
        report, results = run_oracle(
            args.split,
            limit=args.limit,
            workers=args.workers,
            concurrency=args.concurrency,
            max_steps=args.max_steps,
            data_root=args.data_root,
            progress=not args.no_progress,
        )
    except AgentEnvError as exc:
        print(f"agentenv alfworld-oracle: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(report))
    if out is not None:
        write_report(report, results, out)
    return 0 if report.overall.successes == report.overall.episodes else 1
