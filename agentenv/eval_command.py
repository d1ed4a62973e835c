"""``agentenv eval``: a model on any listed environment, under a stated protocol, with a report that survives.

For any environment ``agentenv envs`` lists it loads the model and engine and plays the env's tasks
(:meth:`agentenv.core.Env.tasks`) or, for an env without a task list, a range of seeds, under a
stated protocol (:func:`protocol`; by default the trainer's held-out one: greedy, one sample, the
env's own turn limit). Each episode is logged as it ends (:class:`EpisodeLog`; ``--resume`` plays
the rest after a stop), then the table is printed and the report written as JSON and text
(:mod:`agentenv.evaluation` plays and aggregates). The options are :class:`EvalArgs`, read by tyro.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agentenv.configio import key_values
from agentenv.engines.build import EngineKind, ModelConfig
from agentenv.errors import AgentEnvError, ConfigError
from agentenv.evaluation import (
    EpisodeJob,
    EpisodeResult,
    EvalConfig,
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
from agentenv.rollout.episode import RolloutConfig

if TYPE_CHECKING:
    from agentenv.engines.base import GenerationEngine
    from agentenv.rollout.chat import ChatRenderer


#: Seeds ``agentenv eval`` plays an env without a task list when ``--seeds`` is not given: disjoint from
#: training's (a run with ``run.seed = s`` plays seeds from ``s * 1,000,003`` upwards).
DEFAULT_SEEDS = range(2_000_000_000, 2_000_000_020)
#: The environment evaluated when neither --env nor --remote names one.
DEFAULT_ENV = "alfworld"
#: Constructor arguments that bound an episode's length; ``--max-steps`` sets the first one an env takes.
TURN_LIMIT_ARGS = ("max_steps", "max_turns")
#: Turns an episode may take when ``--max-steps`` is not given (ALFWorld's 50 steps): an env's own,
#: smaller limit ends it first.
DEFAULT_MAX_STEPS = 50


@dataclass(frozen=True)
class EvalArgs:
    """``agentenv eval``'s options: one flag per field, ``--samples-per-game`` for ``samples_per_game``.

    A value the trainer's held-out evaluation also has takes its default from the training config's
    class, so one default holds for both: the model and the engine from
    :class:`~agentenv.engines.build.ModelConfig`, the temperature and the concurrency from
    :class:`~agentenv.evaluation.EvalConfig`, the tokens per reply and top-p from
    :class:`~agentenv.rollout.episode.RolloutConfig`; one episode per task, as the trainer plays.

    Raises:
        ConfigError: A value out of range or a malformed ``--seeds`` (the message names the flag and
            the value).
    """

    env: str | None = None
    """Environment id (`agentenv envs` lists them); None: the one --remote serves, else alfworld."""
    remote: tuple[str, ...] = ()
    """URL of an `agentenv serve` server playing the env; with several, episodes go round-robin.
    The env need not be installed here (nor named: the server says which it serves); its constructor
    arguments are the server's."""
    env_arg: tuple[str, ...] = ()
    """KEY=VALUE: a constructor argument of the environment (VALUE read as YAML)."""
    chat_template_kwarg: tuple[str, ...] = ()
    """KEY=VALUE: a variable of the model's chat template (VALUE read as YAML), e.g. enable_thinking=false
    for Qwen3's thinking-off mode."""
    split: str | None = None
    """Shorthand for --env-arg split=SPLIT (ALFWorld: valid_seen, 140 games, the default; valid_unseen, 134)."""
    model: str | None = ModelConfig.name
    """Model folder (e.g. one `agentenv export` wrote) or mapped name; None: the embedded SmolLM2-135M."""
    engine: EngineKind = ModelConfig.engine
    """Generation engine."""
    gpu_memory_utilization: float | None = ModelConfig.memory_share
    """vLLM's share of the GPU's memory (of host memory on a CPU); None: 0.9 on a GPU, 0.2 on a CPU."""
    samples_per_game: int = 1
    """K episodes per task (the ALFWorld papers sample 3 at temperature 1.0)."""
    limit: int | None = None
    """Play only the first N tasks; None: every task."""
    seeds: str | None = None
    """A:B: seeds A..B-1, one episode each, for an env without a task list; None: 2000000000:2000000020.
    Training plays seeds from run.seed * 1000003 upwards, so these are not among them."""
    concurrency: int = EvalConfig.concurrency
    """Episodes played at once."""
    max_steps: int | None = None
    """Turns per episode; None: the env's own limit, and at most 50 turns.
    Also passed as the env's max_steps or max_turns argument when it takes one (unless --env-arg sets it)."""
    max_new_tokens: int = RolloutConfig.max_new_tokens_per_turn
    """Tokens per reply."""
    max_total_tokens: int | None = None
    """Tokens per episode after the prompt; None: what the model's context holds."""
    temperature: float = EvalConfig.temperature
    """0: greedy, as the trainer's held-out evaluation; above 0: sampled."""
    top_p: float = RolloutConfig.top_p
    """Nucleus mass of sampling, in (0, 1]."""
    seed: int = 0
    """Sampling seed of the engine and of the episodes."""
    data_root: str | None = None
    """Shorthand for --env-arg data_root=PATH (ALFWorld: the alfworld data folder, default <data>/alfworld)."""
    transcripts: int = 10
    """Keep the transcript of the first N episodes in report.json."""
    out: str | None = None
    """Folder for report.json, report.txt and episodes.jsonl; None: runs/eval/<env>[_<split>]."""
    overwrite: bool = False
    """Replace an earlier evaluation in --out (never a folder that is not one)."""
    resume: bool = False
    """Continue the evaluation in --out: play only the episodes it has not recorded (the same protocol)."""
    no_progress: bool = False
    """Print no progress bar."""

    def __post_init__(self) -> None:
        at_least = {"--samples-per-game": (self.samples_per_game, 1), "--concurrency": (self.concurrency, 1),
                    "--limit": (self.limit, 1), "--max-steps": (self.max_steps, 1),
                    "--max-new-tokens": (self.max_new_tokens, 1), "--max-total-tokens": (self.max_total_tokens, 1),
                    "--transcripts": (self.transcripts, 0)}
        for flag, (value, low) in at_least.items():
            if value is not None and value < low:
                raise ConfigError(f"{flag} {value}: expected an integer >= {low}")
        if not 0 <= self.temperature < float("inf"):
            raise ConfigError(f"--temperature {self.temperature}: expected a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p {self.top_p}: expected a number in (0, 1]")
        share = self.gpu_memory_utilization
        if share is not None and not 0 < share <= 1:
            raise ConfigError(f"--gpu-memory-utilization {share}: expected a number in (0, 1]")
        if self.seeds is not None:
            parse_seeds(self.seeds)

    @property
    def seed_range(self) -> range:
        """The seeds an env without a task list plays (``--seeds``, else :data:`DEFAULT_SEEDS`)."""
        return parse_seeds(self.seeds) if self.seeds is not None else DEFAULT_SEEDS


#: What ``agentenv eval --help`` says the command does.
DESCRIPTION = ("Evaluate a model on an environment: its fixed tasks (default: ALFWorld seen games), or a range of "
               "seeds for an env without a task list. By default the trainer's held-out protocol: greedy, one "
               "sample per task, the env's own turn limit.")


def parse_args(argv: Sequence[str]) -> EvalArgs:
    """``agentenv eval``'s command line as :class:`EvalArgs` (tyro; a repeated flag such as ``--env-arg`` adds up).

    Raises:
        SystemExit: ``--help`` (status 0, the help printed), or a flag or value that does not parse or is
            out of range (status 2, the message on stderr naming the flag and the value).
    """
    from agentenv.cli_args import parse

    args = parse(EvalArgs, argv, prog="agentenv eval", description=DESCRIPTION)
    if isinstance(args, int):
        raise SystemExit(args)
    return args


def with_env_id(args: EvalArgs) -> EvalArgs:
    """``args`` with ``env`` filled: as given, else the id the ``--remote`` servers serve, else ``alfworld``.

    Raises:
        ConfigError / RemoteEnvError: The servers cannot be asked or describe themselves wrongly
            (:func:`agentenv.remote.client.describe_servers`).
    """
    if args.env is not None:
        return args
    if not args.remote:
        return replace(args, env=DEFAULT_ENV)
    from agentenv.remote.client import describe_servers

    return replace(args, env=describe_servers(args.remote)["env"])


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


def env_kwargs(args: EvalArgs) -> dict[str, Any]:
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


def template_kwargs(args: EvalArgs) -> dict[str, Any]:
    """The chat template's extra variables from ``--chat-template-kwarg KEY=VALUE`` (VALUE read as YAML).

    Raises:
        ConfigError: An item without ``=`` or with an empty key.
    """
    return key_values(args.chat_template_kwarg, "--chat-template-kwarg")



def _build_engine(args: EvalArgs) -> tuple[GenerationEngine, ChatRenderer]:
    """Load the model and return ``(engine, renderer)`` (:func:`agentenv.engines.build.build_engine`).

    vLLM loads the folder itself; the transformers engine decodes the model loaded here, on a GPU in
    bfloat16 if there is one, else in float32 on the CPU.
    """
    import torch

    from agentenv.engines.build import build_engine
    from agentenv.models import DEFAULT_ALIASES, chat_template, load_model_and_tokenizer, resolve_model_path
    from agentenv.rollout.chat import ChatRenderer

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


def protocol(args: EvalArgs, kwargs: Mapping[str, Any], tasks: str) -> dict[str, Any]:
    """How ``agentenv eval`` plays its episodes, as written in the report (and compared by ``--resume``)."""
    sampling = "greedy" if args.temperature <= 0 else f"temperature {args.temperature}, top_p {args.top_p}"
    return {"sampling": sampling, "samples_per_task": args.samples_per_game, "tasks": tasks,
            "remote": list(args.remote) or None,
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


@dataclass(frozen=True)
class _Plan:
    """What an evaluation plays and where it writes, settled before any model loads."""

    jobs: list[EpisodeJob]
    kinds: list[str]  # every kind of the env, in task order
    split: str
    kwargs: dict[str, Any]  # the env's constructor arguments
    protocol: dict[str, Any]
    out: Path


async def _plan(args: EvalArgs) -> _Plan:
    """Read the env's tasks, choose the jobs and claim ``--out`` (input is checked before the folder is)."""
    from agentenv.registration import make

    template_kwargs(args)  # a malformed --chat-template-kwarg fails before anything loads
    refuse_checkpoint(args.model)
    kwargs = env_kwargs(args)
    async with make(args.env, remote=list(args.remote) or None, **kwargs) as env:
        tasks, split = env.tasks(), env.split
    if tasks is not None and len(tasks) and args.seeds is None:
        jobs = make_jobs(list(zip(tasks.ids, tasks.kinds, strict=True)), samples_per_game=args.samples_per_game,
                         limit=args.limit, seed=args.seed, transcripts=args.transcripts)
        shown = f"first {len(jobs) // args.samples_per_game} of {len(tasks)} tasks"
        kinds = list(dict.fromkeys(tasks.kinds))
    else:
        seeds = args.seed_range
        jobs = seed_jobs(seeds, samples_per_game=args.samples_per_game, transcripts=args.transcripts)
        shown, kinds = f"seeds {seeds.start}:{seeds.stop}", [""]
    out = claim_folder(args.out or Path("runs", "eval", folder_name(args.env, split)), EVALUATION,
                       overwrite=args.overwrite, resume=args.resume)
    return _Plan(jobs, kinds, split, kwargs, protocol(args, kwargs, shown), out)


async def _play(args: EvalArgs, plan: _Plan) -> tuple[EvalReport, list[EpisodeResult]]:
    """Play the jobs ``--out`` has not recorded, logging each as it ends; aggregate every recorded one."""
    from agentenv.registration import make, tool_parser_argument

    log = EpisodeLog(plan.out, plan.protocol, resume=args.resume)
    done = log.keys()
    todo = [j for j in plan.jobs if (j.game, j.sample) not in done]
    if done:
        print(f"agentenv eval: {len(plan.jobs) - len(todo)} of {len(plan.jobs)} episodes recorded before; playing "
              f"the other {len(todo)}", file=sys.stderr)
    start = time.perf_counter()
    remote = list(args.remote) or None
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
            filled = {} if remote else tool_parser_argument(args.env, renderer.tool_parser_name, plan.kwargs)
            if filled:
                print(f"agentenv eval: tool_parser={filled['tool_parser']!r}, from the model's chat template",
                      file=sys.stderr)
            played = {**plan.kwargs, **filled}
            try:
                new = await run_jobs(todo, model_agent(engine, renderer, cfg),
                                     lambda: make(args.env, remote=remote, **played),
                                     concurrency=args.concurrency, progress=not args.no_progress,
                                     on_result=log.add)
            finally:
                await engine.close()
    finally:
        log.close()
    order = {(j.game, j.sample): i for i, j in enumerate(plan.jobs)}
    results = sorted([*log.done, *new], key=lambda r: order.get((r.game, r.sample), len(order)))
    report = aggregate(
        results,
        env=args.env,
        split=plan.split,
        model=args.model or "SmolLM2-135M (embedded)",
        samples_per_game=args.samples_per_game,
        task_order=plan.kinds,
        seconds=time.perf_counter() - start,
        protocol=plan.protocol,
    )
    return report, results


def main(argv: Sequence[str] | None = None) -> int:
    """``agentenv eval``: print and write the success-rate report; return the exit status.

    0: the report is written (or ``--help`` printed); 1: every episode failed (the report is written
    too); 2: bad input (a flag or value that does not parse or is out of range, an unknown env or
    model) or a folder that is not an evaluation's; 130: Ctrl-C (the episodes that ended are in
    ``episodes.jsonl``: ``--resume`` continues).

    Examples: ``agentenv eval --env alfworld --split valid_unseen --model PATH``;
    ``agentenv eval --env examples/GuessNumber-v0 --env-arg high=20``;
    ``agentenv eval --env reasoning_gym/gcd --seeds 0:50 --temperature 1.0 --samples-per-game 3``;
    ``agentenv eval --env examples/GuessNumber-v0 --remote http://127.0.0.1:8000``.
    """
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # tyro printed the help, or the message naming the bad flag or value
        return exc.code if isinstance(exc.code, int) else 2
    plan = None
    try:
        args = with_env_id(args)
        plan = asyncio.run(_plan(args))
        report, results = asyncio.run(_play(args, plan))
    except AgentEnvError as exc:
        print(f"agentenv eval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        out = plan.out if plan is not None else Path(args.out or ".")
        print(f"\nagentenv eval: stopped; the episodes that ended are in {out / 'episodes.jsonl'} "
              "(the same command with --resume plays the rest)", file=sys.stderr)
        return 130
    print(format_table(report))
    path = write_report(report, results, plan.out)
    print(f"report written to {path}")
    if (failed := all_failed(results)) is not None:
        print(f"agentenv eval: {failed}", file=sys.stderr)
        return 1
    return 0
