"""Finding the recipe file of ``agentenv train``: a shipped name, a YAML path, or ``<env>_cpu`` by default.

An environment without a recipe of its own gets ``generic_cpu`` (every id ``agentenv envs`` lists:
registered ids, plugins, and peers' ids such as ``reasoning_gym_tool/gcd``), and with it a run folder
named after the environment (:func:`recipe_data`). Shipped recipes live in ``recipes/``
at the top of the checkout; a non-editable install carries them as ``agentenv/recipes/`` (package
``agentenv.recipes``), which is the same place relative to this module. Every failure is a clear error
naming what was looked for and what exists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentenv.configio import read_yaml
from agentenv.errors import ConfigError, EnvNotFound
from agentenv.output_folders import folder_name
from agentenv.registration import registry, spec

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
"""``recipes/`` beside ``trainer/`` in a checkout; ``agentenv/recipes/`` in an installed wheel."""
DEFAULT_ENV = "python_tool"
"""The environment trained when neither ``--recipe`` nor ``--env`` is given."""
GENERIC_RECIPE = "generic_cpu"
"""The default recipe of a registered environment without a shipped ``<env>_cpu`` recipe."""


def shipped_recipes(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """The names (file stems) of the shipped recipes, sorted; empty when the folder is missing."""
    return sorted(p.stem for p in recipes_dir.glob("*.yaml"))


def _shipped_hint(recipes_dir: Path) -> str:
    names = shipped_recipes(recipes_dir)
    return f"shipped recipes: {', '.join(names)}" if names else f"no recipes are shipped in {recipes_dir}"


def _is_path_like(recipe: str) -> bool:
    return recipe.startswith(("/", ".", "~")) or "/" in recipe or Path(recipe).suffix in (".yaml", ".yml")


def find_recipe(recipe: str | None, env_id: str | None = None, *, remote: bool = False,
                recipes_dir: Path = RECIPES_DIR) -> Path:
    """Return the recipe file to load for ``--recipe`` / ``--env``.

    Args:
        recipe: A shipped recipe name (``python_tool_cpu``), a path to a YAML file, or None for the
            default recipe of the environment: ``<env_id>_cpu``, else ``generic_cpu``.
        env_id: The ``--env`` value; only used when ``recipe`` is None (None means ``python_tool``).
        remote: The env is played on ``agentenv serve`` servers (``env.remote``): it need not be
            registered here.
        recipes_dir: Where the shipped recipes are (tests pass their own).

    Returns:
        An existing YAML file.

    Raises:
        ConfigError: A recipe path that does not exist or is a folder, an unknown recipe name, or a
            registered environment without a shipped ``<env>_cpu`` recipe when ``generic_cpu`` is not
            shipped either; the message lists the shipped recipe names.
        EnvNotFound: ``recipe`` is None, the env is not remote, and ``env_id`` is neither registered
            nor an installed peer's id; the message lists the registered ids.
    """
    if recipe is None:
        env = env_id or DEFAULT_ENV
        try:
            if not remote:
                spec(env)  # a peer's id (reasoning_gym_tool/gcd, gem/..., textarena/...) is registered here
        except EnvNotFound:
            known = ", ".join(sorted(registry)) or "none"
            raise EnvNotFound(f"unknown environment {env!r} (registered environments: {known}; and the ids "
                              "of installed peers: `agentenv envs` lists them all)") from None
        candidate = recipes_dir / f"{env}_cpu.yaml"
        if candidate.is_file():
            return candidate
        generic = recipes_dir / f"{GENERIC_RECIPE}.yaml"
        if generic.is_file():
            return generic
        raise ConfigError(f"environment {env!r} has no shipped default recipe ({candidate.name}, nor {generic.name}); "
                          f"pass --recipe with a recipe name or a YAML file ({_shipped_hint(recipes_dir)})")
    if _is_path_like(recipe):
        path = Path(recipe).expanduser()
        if path.is_file():
            return path
        shipped = recipes_dir / path.name
        if "/" not in recipe and shipped.is_file():  # "python_tool_cpu.yaml" names the shipped file
            return shipped
        if path.is_dir():
            raise ConfigError(f"recipe {recipe!r} is a folder, not a YAML file ({_shipped_hint(recipes_dir)})")
        raise ConfigError(f"recipe file {recipe!r} does not exist ({_shipped_hint(recipes_dir)}; "
                          f"pass one by name, e.g. --recipe {DEFAULT_ENV}_cpu)")
    candidate = recipes_dir / f"{recipe}.yaml"
    if candidate.is_file():
        return candidate
    raise ConfigError(f"unknown recipe {recipe!r} ({_shipped_hint(recipes_dir)}; or pass a path to a YAML file)")


def run_folder_for(env_id: str) -> str:
    """The run folder of ``env_id`` trained with the generic recipe: ``runs/<env id, / and : as _>``.

    >>> run_folder_for("reasoning_gym_tool/gcd")
    'runs/reasoning_gym_tool_gcd'
    """
    return f"runs/{folder_name(env_id)}"


def recipe_data(recipe: str | None, env_id: str | None = None, *, remote: bool = False,
                recipes_dir: Path = RECIPES_DIR) -> dict[str, Any]:
    """The recipe of ``--recipe`` / ``--env`` as a dict, ready for command-line overrides.

    The generic recipe (chosen for an environment without a recipe of its own, or named) trains
    ``env_id`` in :func:`run_folder_for` it, so that two environments never share a run folder.

    Raises:
        ConfigError / EnvNotFound: as :func:`find_recipe`.
    """
    path = find_recipe(recipe, env_id, remote=remote, recipes_dir=recipes_dir)
    data = read_yaml(path)
    if path.stem == GENERIC_RECIPE and env_id is not None:
        data.setdefault("run", {})["run_dir"] = run_folder_for(env_id)
    return data
