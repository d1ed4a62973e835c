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

import argparse
import asyncio
import dataclasses
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

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


def parse_args(argv: list[str]) -> tuple[TrainConfig, argparse.Namespace]:
    """Command line -> config. ``--section.field value`` and ``section.field=value`` override the recipe."""
    ap = argparse.ArgumentParser(
        prog="agentenv train", description=__doc__.split("\n\n")[0],
        epilog="Any config value can be set with --section.field VALUE or section.field=VALUE "
               "(e.g. --optim.lr 1e-5 run.batch_size=16); --print-config shows them all, --help-config says "
               "what each means.")
    ap.add_argument("--recipe", help="recipe name in recipes/ or a YAML path (default: <env>_cpu)")
    ap.add_argument("--env", help="environment id (env.id)")
    ap.add_argument("--env-remote", action="append", metavar="URL",
                    help="play the env on this `agentenv serve` server (env.remote; repeat for more servers); "
                         "the env need not be installed here")
    ap.add_argument("--model", help="local model folder or mapped name (model.name); default: embedded SmolLM2-135M")
    ap.add_argument("--run-dir", help="run folder (run.run_dir)")
    ap.add_argument("--updates", type=int, help="optimizer steps (run.updates)")
    ap.add_argument("--policy", choices=["none", "max_lag", "pace", "sync"],
                    help="staleness.policy (sync: generation and training alternate, the baseline)")
    ap.add_argument("--resume", action="store_true", help="continue the run in --run-dir from its latest checkpoint")
    ap.add_argument("--overwrite", action="store_true", help="delete an existing run folder first")
    ap.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    ap.add_argument("--help-config", nargs="?", metavar="SECTION", action=_ConfigHelp,
                    help="list every config value (or a section's: optim, run, ...) with its type, default "
                         "and meaning, and exit")
    args, rest = ap.parse_known_args(argv)
    overrides = _dotted_overrides(rest)
    remote = bool(args.env_remote) or any(o.startswith("env.remote=") for o in overrides)
    data = recipe_data(args.recipe, args.env, remote=remote)  # the generic recipe names its run folder after the env
    for flag, key in (("env", "env.id"), ("model", "model.name"), ("run_dir", "run.run_dir"),
                      ("updates", "run.updates"), ("policy", "staleness.policy")):
        value = getattr(args, flag)
        if value is not None:
            overrides.append(f"{key}={json.dumps(value)}")
    if args.env_remote:
        overrides.append(f"env.remote={json.dumps(args.env_remote)}")
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
