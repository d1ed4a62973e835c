"""The environment registry: ``register`` / ``make`` in the manner of Gymnasium's.

Built-in environments are registered lazily by import path, so importing agentenv loads none of
them. Other installed packages add environments through the ``agentenv.envs`` entry-point group:
each entry point names a callable that calls :func:`register` (see ``examples/``). Plugins load the
first time the registry is read.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentenv.core import Env
from agentenv.errors import ConfigError, EnvNotFound, RegistrationError

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "agentenv.envs"


@dataclass(frozen=True)
class EnvSpec:
    """How to build one registered environment.

    Attributes:
        id: Registry id, ``name`` or ``namespace/Name-vN``.
        entry_point: ``"package.module:ClassOrFactory"`` or the callable itself.
        kwargs: Default constructor arguments; ``make`` overrides them key by key.
        description: One line shown by ``agentenv envs``.
    """

    id: str
    entry_point: str | Callable[..., Env]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def load(self) -> Callable[..., Env]:
        """Import and return the entry point.

        Raises:
            RegistrationError: The module or attribute cannot be imported.
        """
        if callable(self.entry_point):
            return self.entry_point
        module_name, _, attr = self.entry_point.partition(":")
        if not attr:
            raise RegistrationError(f"entry point {self.entry_point!r} of {self.id!r} must be 'module:attr'")
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise RegistrationError(f"cannot load {self.id!r} from {self.entry_point!r}: {exc}") from exc


registry: dict[str, EnvSpec] = {}
_plugins_loaded = False


def register(
    id: str,
    entry_point: str | Callable[..., Env],
    *,
    description: str = "",
    **kwargs: Any,
) -> EnvSpec:
    """Register an environment under ``id``.

    Args:
        id: Unique id. Put variants (difficulty, data set) in ``kwargs``, not in new ids.
        entry_point: ``"module:Class"`` or a callable returning an :class:`~agentenv.core.Env`.
        description: One line for ``agentenv envs``.
        **kwargs: Default constructor arguments.

    Raises:
        RegistrationError: ``id`` is already registered.
    """
    if id in registry:
        raise RegistrationError(f"environment id {id!r} is already registered ({registry[id].entry_point!r})")
    spec = EnvSpec(id=id, entry_point=entry_point, kwargs=dict(kwargs), description=description)
    registry[id] = spec
    _register_in_gymnasium(id)
    return spec


GYM_NAMESPACE = "agentenv"
"""Gymnasium's namespace of agentenv's ids: ``gymnasium.make("agentenv/python_tool")``."""


def gym_id(agentenv_id: str) -> str:
    """The Gymnasium id of an agentenv id: ``agentenv/<id>`` with ``/`` inside ``id`` turned into ``.``."""
    return f"{GYM_NAMESPACE}/{agentenv_id.replace('/', '.')}"


def _register_in_gymnasium(agentenv_id: str) -> None:
    """Add ``agentenv_id`` to Gymnasium's registry, by name only: nothing is imported until it is made.

    Gymnasium is imported already (agentenv's spaces are Gymnasium's), so every registered id, the
    built-ins at ``import agentenv`` among them, is a ``gymnasium.make`` away; an id Gymnasium's
    syntax refuses is left out (``agentenv.gym_adapter`` can still wrap it).
    """
    import gymnasium

    gid = gym_id(agentenv_id)
    if gid in gymnasium.registry:
        return
    try:
        gymnasium.register(id=gid, entry_point="agentenv.gym_adapter:make_sync", kwargs={"agentenv_id": agentenv_id},
                           disable_env_checker=False)
    except gymnasium.error.Error as exc:
        logger.debug("%s is not a Gymnasium id (%s): not registered there", gid, exc)


def load_plugins(*, force: bool = False) -> list[str]:
    """Run the ``agentenv.envs`` entry points of installed packages once.

    A plugin that fails to load is logged and skipped; the others still load.

    Returns:
        Names of the entry points that loaded.
    """
    global _plugins_loaded
    if _plugins_loaded and not force:
        return []
    _plugins_loaded = True
    loaded = []
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            hook = ep.load()
            if callable(hook):
                hook()
            loaded.append(ep.name)
        except Exception as exc:  # a broken plugin must not break the registry
            logger.warning("agentenv plugin %r failed to load: %s", ep.name, exc)
    return loaded


def spec(id: str) -> EnvSpec:
    """Return the :class:`EnvSpec` registered under ``id``.

    An id the registry does not hold is offered to the resolvers plugins added (:func:`add_resolver`):
    agentenv's own entry point adds the peers' (``gym/ID``, ``reasoning_gym/FAMILY``, ``gem/ID``, ...:
    :mod:`agentenv.adapters`), which register it the first time it is asked for.

    Raises:
        EnvNotFound: ``id`` is not registered; the message lists the registered ids.
    """
    load_plugins()
    if id in registry:
        return registry[id]
    for resolver in _resolvers.values():
        found = resolver.resolve(id)
        if found is not None:
            return found
    known = ", ".join(sorted(registry)) or "none"
    patterns = "".join(f"; {r.patterns}" for r in _resolvers.values())
    raise EnvNotFound(f"no environment {id!r} is registered (registered: {known}{patterns})")


@dataclass(frozen=True)
class Resolver:
    """Registers ids of a family on first use (a peer's ``gym/ID``: :mod:`agentenv.adapters`).

    Attributes:
        resolve: ``resolve(id)`` registers ``id`` and returns its spec, or returns None when ``id``
            is not one of the family's.
        patterns: The family's ids, for the message of an unknown id (``"peers' ids: gym/ID, ..."``).
    """

    resolve: Callable[[str], EnvSpec | None]
    patterns: str


_resolvers: dict[str, Resolver] = {}


def add_resolver(name: str, resolver: Resolver) -> None:
    """Ask ``resolver`` for every id the registry does not hold (after those added before it).

    Called by a plugin's ``agentenv.envs`` entry point; adding the same ``name`` again replaces it.
    """
    _resolvers[name] = resolver


def make(id: str, *, remote: str | Sequence[str] | None = None, **kwargs: Any) -> Env:
    """Build the environment registered as ``id``; ``kwargs`` override the registered defaults.

    With ``remote`` (a server URL or a list of them), return an :class:`agentenv.remote.RemoteEnv`
    playing ``id`` on those ``agentenv serve`` servers instead; ``id`` need not be registered here,
    and the constructor arguments are the server's (``agentenv serve ID --env-arg K=V``).

    Raises:
        EnvNotFound: ``id`` is not registered.
        RegistrationError: The entry point cannot be imported.
        ConfigError: A keyword argument the environment's constructor does not take (e.g. a recipe's
            ``env.kwargs`` written for another environment); the message lists the ones it takes.
            With ``remote``: any keyword argument, a bad URL, or a server serving another id.
        RemoteEnvError: With ``remote``: no server answered.
    """
    if remote is not None:
        if kwargs:
            raise ConfigError(f"remote environment {id!r}: constructor arguments ({', '.join(sorted(kwargs))}) "
                              "belong to the server: agentenv serve ID --env-arg KEY=VALUE")
        from agentenv.remote.client import RemoteEnv

        return RemoteEnv(id, remote)
    entry, merged = checked_arguments(id, kwargs)
    env = entry(**merged)
    if not isinstance(env, Env):
        raise RegistrationError(f"{id!r} built {type(env).__name__}, which is not an agentenv Env")
    return env


def checked_arguments(id: str, kwargs: Mapping[str, Any]) -> tuple[Callable[..., Env], dict[str, Any]]:
    """The constructor of ``id`` and its arguments (the registered defaults, then ``kwargs``), checked by name.

    Nothing is built: a command can refuse a misspelt argument before it writes anything.

    Raises:
        EnvNotFound: ``id`` is not registered.
        RegistrationError: The entry point cannot be imported.
        ConfigError: A keyword argument the constructor does not take; the message lists the ones it takes.
    """
    env_spec = spec(id)
    entry = env_spec.load()
    merged = {**env_spec.kwargs, **kwargs}
    accepted = constructor_parameters(entry)
    unknown = sorted(set(merged) - set(accepted)) if accepted is not None else []
    if unknown:
        raise ConfigError(f"environment {id!r} does not take {', '.join(map(repr, unknown))}; it takes: "
                          f"{', '.join(accepted) or 'no keyword arguments'} (check env.kwargs in the recipe)")
    return entry, merged


def constructor_parameters(entry: Callable[..., Any]) -> list[str] | None:
    """The keyword arguments ``entry`` (an Env class or factory) takes, in order; None if it takes ``**kwargs``."""
    try:
        sig = inspect.signature(entry)
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return None
    return [name for name, p in sig.parameters.items()
            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]


def tool_parser_argument(id: str, parser: str | None, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """``{"tool_parser": parser}`` where the env ``id`` takes that argument and nothing sets it yet, else ``{}``.

    Training and ``agentenv eval`` fill an env's tool-call parser from the model's chat template
    (``ChatRenderer.tool_parser_name``) this way: only when the env's constructor takes a
    ``tool_parser`` argument and neither ``kwargs`` (the user's) nor the env's registration sets it.
    Generic: the env's signature decides, not its id.

    Args:
        id: A registered environment id.
        parser: The registered parser name the template implies, or None (nothing to fill).
        kwargs: The constructor arguments given.

    Raises:
        EnvNotFound: ``id`` is not registered.
        RegistrationError: The entry point cannot be imported.
    """
    if parser is None or "tool_parser" in kwargs:
        return {}
    env_spec = spec(id)
    if "tool_parser" in env_spec.kwargs or "tool_parser" not in (constructor_parameters(env_spec.load()) or ()):
        return {}
    return {"tool_parser": parser}


def _register_builtins() -> None:
    register(
        "python_tool",
        "agentenv.envs.python_tool:PythonToolEnv",
        description="Math problems solved with a sandboxed Python tool; reward 1 for a correct \\boxed{} answer.",
    )
    register(
        "alfworld",
        "agentenv.envs.alfworld:AlfWorldEnv",
        description="ALFWorld household text games (TextWorld); reward 1 on a won game.",
    )


_register_builtins()
