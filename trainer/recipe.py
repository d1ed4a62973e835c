"""``agentenv train``'s command line: recipe YAML + overrides -> :class:`TrainConfig`, the run folder, the run.

The loop itself (rollout, select, update, sync, log) is :mod:`agentenv.trainer.train`.

Ctrl-C stops cleanly: during the warm-up after its current step (nothing cached), during a held-out
evaluation at once (nothing written), during training after the current update, with a final
checkpoint. ``--resume`` continues with the same versions, from the run folder's saved config with
only the options given on its command line changed (e.g. ``--updates 40`` to train further); after a
``kill -9`` too, at any moment, without losing or repeating a task (what a checkpoint holds and how
the run is put back: :mod:`agentenv.trainer.resume`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
import yaml

from agentenv.cli_args import agentenv_conventions
from agentenv.configio import apply_overrides, is_override, load_config, read_yaml, to_dict
from agentenv.errors import AgentEnvError, ConfigError, Interrupted, RunFolderError
from agentenv.models import check_model
from agentenv.output_folders import RUN, claim_folder
from agentenv.trainer import setup
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.recipe_files import find_recipe, recipe_data
from agentenv.trainer.train import train

logger = logging.getLogger("agentenv.train")



def resolve_recipe(name: str) -> Path:
    """A recipe name (``recipes/<name>.yaml``) or a path to a YAML file.

    Raises:
        ConfigError: No such recipe or file; the message lists the shipped ones.
    """
    return find_recipe(name)


DESCRIPTION = ("Train a model with asynchronous RL: a recipe and the command line's overrides make the config. "
               "Any config value can be set with --section.field VALUE or section.field=VALUE (e.g. --optim.lr "
               "1e-5 run.batch_size=16); --print-config shows them all, --help-config says what each means.")


@dataclass
class TrainArgs:
    """``agentenv train``'s options; every config value is set with --section.field VALUE or section.field=VALUE.

    Attributes:
        recipe: Recipe name in recipes/ or a YAML path (default: <env>_cpu).
        env: Environment id (env.id); with --env-remote and no --recipe, default: the one the server serves.
        env_remote: Play the env on this `agentenv serve` server (env.remote; repeat for more servers); the
            env need not be installed here.
        model: Local model folder or mapped name (model.name); default: embedded SmolLM2-135M.
        run_dir: Run folder (run.run_dir).
        updates: Optimizer steps (run.updates).
        policy: staleness.policy (sync: generation and training alternate, the baseline).
        resume: Continue the run in --run-dir from its latest checkpoint.
        overwrite: Delete an existing run folder first.
        print_config: Print the resolved config and exit.
        help_config: List every config value (or a section's: optim, run, ...) with its type, default and
            meaning, and exit (--help-config alone: every section).
        overrides: The command line's config overrides as section.field=value, in order (re-applied to
            the saved config by --resume).
    """

    recipe: str | None = None
    env: str | None = None
    env_remote: tuple[str, ...] = ()
    model: str | None = None
    run_dir: str | None = None
    updates: int | None = None
    policy: Literal["none", "max_lag", "pace", "sync"] | None = None
    resume: bool = False
    overwrite: bool = False
    print_config: bool = False
    help_config: Annotated[str | None, tyro.conf.arg(metavar="SECTION")] = None
    overrides: tyro.conf.Suppress[list[str]] = dataclasses.field(default_factory=list)


def parse_args(argv: list[str]) -> tuple[TrainConfig, TrainArgs]:
    """Command line -> config. ``--section.field value`` and ``section.field=value`` override the recipe.

    Raises:
        SystemExit: ``--help`` or ``--help-config`` (status 0, printed), or a flag that does not parse or
            a section ``--help-config`` does not know (status 2, the message on stderr).
        ConfigError: An override that does not fit the config.
    """
    argv = _help_config_alone(argv)
    args, rest = tyro.cli(TrainArgs, args=argv, prog="agentenv train", description=DESCRIPTION,
                          return_unknown_args=True, config=agentenv_conventions())
    if args.help_config is not None:
        _print_config_help(args.help_config)
    overrides = _dotted_overrides(rest)
    if args.env_remote and args.env is None and args.recipe is None and not any(o.startswith("env.id=")
                                                                               for o in overrides):
        from agentenv.remote.client import describe_servers

        args.env = describe_servers(args.env_remote)["env"]  # the served env: nothing to name or install here
    remote = bool(args.env_remote) or any(o.startswith("env.remote=") for o in overrides)
    data = recipe_data(args.recipe, args.env, remote=remote)  # the generic recipe names its run folder after the env
    for flag, key in (("env", "env.id"), ("model", "model.name"), ("run_dir", "run.run_dir"),
                      ("updates", "run.updates"), ("policy", "staleness.policy")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if args.env_remote:
        overrides.append(f"env.remote={json.dumps(list(args.env_remote))}")
    cfg = load_config(TrainConfig, apply_overrides(data, overrides))
    args.overrides = overrides
    return cfg, args


def _help_config_alone(argv: list[str]) -> list[str]:
    """``--help-config`` with no section (last, or before another flag or an override) stands for every section."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--help-config" and (i + 1 == len(out) or out[i + 1].startswith("-") or is_override(out[i + 1])):
            out.insert(i + 1, "")
            break
    return out


def _print_config_help(section: str) -> None:
    """``--help-config [SECTION]``: the documented config values (:mod:`agentenv.config_help`), then exit.

    Raises:
        SystemExit: Always: 0 after printing, 2 for a section or value the config does not have.
    """
    from agentenv.config_help import format_config_help

    try:
        text = format_config_help(TrainConfig, section or None)
    except KeyError:
        print(f"agentenv train: --help-config: no config section or value {section!r} (sections: "
              f"{', '.join(f.name for f in dataclasses.fields(TrainConfig))})", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{text}\n\nDefaults of the config classes; a recipe sets its own (--print-config shows them). "
          "Set any value with --section.field VALUE or section.field=VALUE.")
    raise SystemExit(0)


def _dotted_overrides(rest: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(rest):
        a = rest[i]
        if is_override(a):
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
