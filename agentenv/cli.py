"""The ``agentenv`` command: one subcommand per job, each implemented in its own module.

Subcommands import their module only when chosen, so ``agentenv envs`` never loads torch.
"""

from __future__ import annotations

import importlib
import sys

from agentenv.malloc import return_freed_memory_to_os

#: subcommand -> ("module:function", one-line help). Each function takes ``argv`` and returns an exit code.
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("agentenv.trainer.recipe:main", "train a model with asynchronous RL (FlashREINFORCE + PACE)"),
    "eval": ("agentenv.eval_command:main", "evaluate a model on an environment (e.g. ALFWorld seen/unseen)"),
    "export": ("agentenv.trainer.export:main", "write a run's checkpoint as a Hugging Face model folder"),
    "compare": ("agentenv.trainer.experiments.compare:main", "run one recipe in sync and async modes; print a table"),
    "study": ("agentenv.trainer.experiments.study:main",
              "rerun one of the papers' claims at small scale: table and plots"),
    "envs": ("agentenv.registration_cli:list_envs_main", "list the registered environments"),
    "serve": ("agentenv.remote.server:main", "serve a registered environment over HTTP (one session per episode)"),
    "sandbox": ("agentenv.sandboxes.cli:main", "sandbox tools: build-image, info"),
    "simulate": ("agentenv.trainer.experiments.simulator:main",
                 "simulate the asynchronous pipeline under each staleness policy"),
    "alfworld-oracle": ("agentenv.envs.alfworld.oracle:oracle_main", "replay ALFWorld walkthroughs (sanity check)"),
}

#: top-level module -> the install extra that provides it (pyproject.toml), for the message of a command
#: run in an environment that lacks it (``pip install agentenv`` holds the environment API only).
EXTRA_OF: dict[str, str] = {
    **dict.fromkeys(("torch", "transformers", "safetensors", "accelerate", "tqdm", "tensorboard", "matplotlib",
                     "tyro"), "train"),
    **dict.fromkeys(("math_verify", "pyarrow", "reasoning_gym", "docker"), "python-tool"),
    "httpx": "remote",
    **dict.fromkeys(("starlette", "uvicorn"), "serve"),
    "openai": "agents",
    "vllm": "vllm",
    "alfworld": "alfworld",
}


def version() -> str:
    """The installed distribution's version (``agentenv.__version__`` when it runs from a bare checkout)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("agentenv")
    except PackageNotFoundError:
        from agentenv import __version__

        return __version__


def _usage() -> str:
    lines = ["usage: agentenv [--version] <command> [options]", "", "commands:"]
    lines += [f"  {name:<16} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "Run 'agentenv <command> --help' for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``agentenv`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        print(f"agentenv {version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"agentenv: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    return_freed_memory_to_os()  # before any tensor exists: keeps long training runs from growing
    module_name, _, func_name = COMMANDS[name][0].partition(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        return int(func(rest) or 0)
    except ModuleNotFoundError as e:
        extra = EXTRA_OF.get((e.name or "").partition(".")[0])
        if extra is None:
            raise
        print(f"agentenv {name}: the package {e.name!r} is not installed; it comes with the {extra!r} extra: "
              f"pip install \"agentenv[{extra}]\"", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
