"""``agentenv eval``: a model on any listed environment, under a stated protocol, with a report that survives.

For any environment ``agentenv envs`` lists it loads the model and engine and plays the env's tasks
(:meth:`agentenv.core.Env.tasks`) or, for an env without a task list, a range of seeds, under a
stated protocol (:func:`protocol`; by default the trainer's held-out one: greedy, one sample, the
env's own turn limit). Each episode is logged as it ends (:class:`EpisodeLog`; ``--resume`` plays
the rest after a stop), then the table is printed and the report written as JSON and text
(:mod:`agentenv.evaluation` plays and aggregates).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv.configio import key_values
from agentenv.engines.build import ENGINES
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.evaluation import (
    EpisodeResult,
    EvalReport,
    aggregate,
    format_table,
    make_jobs,
    model_agent,
    run_jobs,
    seed_jobs,
    write_report,
)
from agentenv.output_folders import EVALUATION, claim_folder, folder_name

if TYPE_CHECKING:
    from agentenv.chat import ChatRenderer
    from agentenv.engines.base import GenerationEngine


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="agentenv eval",
        description="Evaluate a model on an environment: its fixed tasks (default: ALFWorld seen games), or a "
                    "range of seeds for an env without a task list. By default the trainer's held-out protocol: "
                    "greedy, one sample per task, the env's own turn limit.",
    )
    p.add_argument("--env", default="alfworld", help="environment id (`agentenv envs`)")
    p.add_argument("--remote", action="append", default=None, metavar="URL",
                   help="play the env on this `agentenv serve` server (repeat for more: episodes go round-robin); "
                        "the env need not be installed here, and its constructor arguments are the server's")
    p.add_argument("--env-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="a constructor argument of the environment (VALUE read as YAML); repeat for more")
    p.add_argument("--chat-template-kwarg", action="append", default=[], metavar="KEY=VALUE",
                   help="a variable of the model's chat template (VALUE read as YAML), e.g. enable_thinking=false "
                        "for Qwen3's thinking-off mode; repeat for more")
    p.add_argument("--split", default=None, help="shorthand for --env-arg split=SPLIT (ALFWorld: valid_seen, "
                   "140 games, the default; valid_unseen, 134)")
    p.add_argument("--model", default=None, help="model folder, e.g. one `agentenv export` wrote (default: the "
                   "embedded SmolLM2-135M)")
    p.add_argument("--engine", default="transformers", choices=ENGINES)
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
    p.add_argument("--out", default=None, help="folder for report.json, report.txt and episodes.jsonl (default: "
                   "runs/eval/<env>[_<split>], e.g. runs/eval/alfworld_valid_unseen)")
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

    With ``--remote`` the server owns the constructor arguments: there are none here, and
    ``--max-steps`` bounds the turns on this side only.

    Raises:
        ConfigError: An ``--env-arg`` without ``=`` or with an empty key; ``--env-arg``, ``--split`` or
            ``--data-root`` with ``--remote``.
        EnvNotFound: ``--env`` is not registered (and not ``--remote``).
    """
    from agentenv.registration import constructor_parameters, spec

    kwargs = key_values(args.env_arg, "--env-arg")
    for key, value in (("split", args.split), ("data_root", args.data_root)):
        if value is not None:
            kwargs[key] = value
    if args.remote:
        if kwargs:
            raise ConfigError(f"--remote: the server builds the env, so its arguments ({', '.join(sorted(kwargs))}) "
                              f"go to it: agentenv serve {args.env} --env-arg KEY=VALUE")
        return kwargs
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
    return key_values(args.chat_template_kwarg, "--chat-template-kwarg")



def _build_engine(args: argparse.Namespace) -> tuple[GenerationEngine, ChatRenderer]:
    """Load the model and return ``(engine, renderer)`` (:func:`agentenv.engines.build.build_engine`).

    vLLM loads the folder itself; the transformers engine decodes the model loaded here, on a GPU in
    bfloat16 if there is one, else in float32 on the CPU.
    """
    import torch

    from agentenv.chat import ChatRenderer
    from agentenv.engines.build import build_engine
    from agentenv.models import DEFAULT_ALIASES, chat_template, load_model_and_tokenizer, resolve_model_path

    if args.engine == "vllm":
        from transformers import AutoTokenizer

        path = resolve_model_path(args.model)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        if args.model is None or str(args.model) in DEFAULT_ALIASES:
            tokenizer.chat_template = chat_template()
        engine = build_engine("vllm", path=path, seed=args.seed, memory_share=args.gpu_memory_utilization)
    else:
        gpu = torch.cuda.is_available()
        model, tokenizer = load_model_and_tokenizer(
            args.model, dtype=torch.bfloat16 if gpu else torch.float32, device="cuda" if gpu else "cpu"
        )
        engine = build_engine("transformers", model=model, tokenizer=tokenizer, seed=args.seed)
    return engine, ChatRenderer(tokenizer, template_kwargs=template_kwargs(args))


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
    return {"sampling": sampling, "samples_per_task": args.samples_per_game, "tasks": tasks, "remote": args.remote,
            "max_turns": args.max_steps or f"the env's own, at most {DEFAULT_MAX_STEPS}",
            "max_new_tokens_per_turn": args.max_new_tokens,
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
    from agentenv.registration import make, tool_parser_argument
    from agentenv.rollout import RolloutConfig

    template_kwargs(args)  # a malformed --chat-template-kwarg fails before anything loads
    refuse_checkpoint(args.model)
    kwargs = env_kwargs(args)
    async with make(args.env, remote=args.remote, **kwargs) as env:
        tasks, split = env.tasks(), env.split
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
    args.out = args.out or str(Path("runs", "eval", folder_name(args.env, split)))
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
            # the model's tool-call format, as training fills it (a remote env's arguments are the server's)
            filled = {} if args.remote else tool_parser_argument(args.env, renderer.tool_parser_name, kwargs)
            if filled:
                print(f"agentenv eval: tool_parser={filled['tool_parser']!r}, from the model's chat template",
                      file=sys.stderr)
            played = {**kwargs, **filled}
            try:
                new = await run_jobs(todo, model_agent(engine, renderer, cfg),
                                     lambda: make(args.env, remote=args.remote, **played),
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
    ``agentenv eval --env reasoning_gym/gcd --seeds 0:50 --temperature 1.0 --samples-per-game 3``;
    ``agentenv eval --env examples/GuessNumber-v0 --remote http://127.0.0.1:8000``.
    """
    args = _parser().parse_args(argv)
    try:
        report, results, out = asyncio.run(_run(args))
    except AgentEnvError as exc:
        print(f"agentenv eval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nagentenv eval: stopped; the episodes that ended are in {Path(args.out or '.') / 'episodes.jsonl'} "
              "(the same command with --resume plays the rest)", file=sys.stderr)
        return 130
    print(format_table(report))
    path = write_report(report, results, out)
    print(f"report written to {path}")
    if (failed := all_failed(results)) is not None:
        print(f"agentenv eval: {failed}", file=sys.stderr)
        return 1
    return 0
