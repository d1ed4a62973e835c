"""Peers' environments, unchanged, behind agentenv's :class:`~agentenv.core.Env` contract.

One module per peer; each maps the peer's reset/step/reward/termination (and, where the peer deals
episodes from seeds, a task list of seeds) onto agentenv's contract. Ids, ``PEER/PEER_ID``:

===============================  =====================================================  ==================  ========
id                               plays                                                  package (extra)     cut_turn
===============================  =====================================================  ==================  ========
``gym/<GYMNASIUM ID>``           any Gymnasium env with ``spaces.Text`` spaces          ``gymnasium``       act
``reasoning_gym/<FAMILY>``       a reasoning-gym family, one reply, its verifier        ``reasoning-gym``   end
``reasoning_gym_tool/<FAMILY>``  the same with the sandboxed Python tool                ``reasoning-gym``   end
``gem/<GEM ID>``                 GEM, e.g. ``gem/game:GuessTheNumber-v0``               ``gem-llm``         act [1]_
``textarena/<ID>``               TextArena's single-player games                        ``textarena``       act
``skyrl_gym/<ID>``               SkyRL-gym, one dataset row a task (``data=PATH``)      ``skyrl-gym``       end
``openenv/<NAME>``               an OpenEnv server, over its protocol (``url=URL``)     ``websockets``      act
``verifiers/<NAME>``             a verifiers environment's own rollout loop and rubric  ``starlette`` [2]_  agent
===============================  =====================================================  ==================  ========

``cut_turn`` (:class:`agentenv.core.Env`) is what a reply cut by the per-turn token budget does: in a
game (``act``) it is still played as the move and the game goes on; in a single graded answer
(``end``) it ends the episode ungraded. gymnasium and reasoning-gym are core dependencies; gem-llm,
textarena and skyrl-gym come with the ``[gem]``, ``[textarena]`` and ``[skyrl]`` extras; the OpenEnv
client (``websockets``, ``httpx``) with ``[openenv]``, while the OpenEnv server runs in its own Python
environment. A verifiers environment runs in its own Python environment too (``python=PATH``, default
``.venv-verifiers``), as an agent program against agentenv's endpoint (the ``[agents]`` extra).

.. [1] GEM's ids outside ``game:`` (math, QA: one graded answer) are ``end``.
.. [2] The endpoint's server (``[agents]``); the environment's own loop decides what a cut reply does.

Ids are resolved when first asked for (:func:`resolve`, which :func:`agentenv.make` asks for an id
the registry does not hold: agentenv's own ``agentenv.envs`` entry point, :func:`add_peers`, adds
it), so importing agentenv imports no peer. ``agentenv envs`` lists every
id of every installed peer (:func:`installed_specs`) from a listing saved per installed version of
the peer (:mod:`agentenv.adapters.listing`): the first listing after a peer is installed or upgraded
imports it, later ones do not. Gymnasium's ids, which say nothing of their spaces until built, are
listed as the pattern ``gym/<ID>``. A listed game that cannot be built here (an NLTK corpus it needs
is not installed, ...: :mod:`agentenv.adapters.needs`) is listed with what it needs
(:func:`unavailable`), and making it raises :class:`~agentenv.errors.EnvUnavailable`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any

from agentenv.adapters import listing
from agentenv.adapters.needs import unavailable_reason
from agentenv.registration import EnvSpec, Resolver, add_resolver, register, registry


@dataclass(frozen=True)
class Adapter:
    """One peer: its id prefix, adapter class, the module and distribution it needs, and a description template."""

    prefix: str
    entry_point: str
    package: str
    distribution: str
    description: str

    def installed(self) -> bool:
        """Whether the peer's package can be imported here (checked without importing it)."""
        return importlib.util.find_spec(self.package) is not None

    def module(self) -> Any:
        """The adapter's module (imports it, and with it the peer)."""
        return importlib.import_module(self.entry_point.partition(":")[0])


ADAPTERS: tuple[Adapter, ...] = (
    Adapter(
        "gym/",
        "agentenv.adapters.gym_env:GymnasiumEnv",
        "gymnasium",
        "gymnasium",
        "Gymnasium {} (text spaces), through agentenv's contract",
    ),
    Adapter(
        "reasoning_gym/",
        "agentenv.adapters.reasoning_gym_env:ReasoningGymEnv",
        "reasoning_gym",
        "reasoning-gym",
        "reasoning-gym {}: one reply with an <answer> tag; reward = the family's verifier score",
    ),
    Adapter(
        "reasoning_gym_tool/",
        "agentenv.adapters.reasoning_gym_env:ReasoningGymToolEnv",
        "reasoning_gym",
        "reasoning-gym",
        "reasoning-gym {} with the sandboxed Python tool; reward = the verifier's score of the \\boxed{{}}",
    ),
    Adapter("gem/", "agentenv.adapters.gem_env:GemEnv", "gem", "gem-llm", "GEM {} (gem-llm)"),
    Adapter(
        "textarena/",
        "agentenv.adapters.textarena_env:TextArenaEnv",
        "textarena",
        "textarena",
        "TextArena {} (single player; reward at the end)",
    ),
    Adapter(
        "skyrl_gym/",
        "agentenv.adapters.skyrl_gym_env:SkyRLGymEnv",
        "skyrl_gym",
        "skyrl-gym",
        "SkyRL-gym {} (skyrl-gym); tasks from a SkyRL dataset file: env.kwargs.data=PATH",
    ),
    Adapter(
        "openenv/",
        "agentenv.adapters.openenv_env:OpenEnvEnv",
        "websockets",
        "websockets",
        "OpenEnv server {}: env.kwargs.url=http://HOST:PORT",
    ),
    Adapter(
        "verifiers/",
        "agentenv.adapters.verifiers_env:VerifiersEnv",
        "starlette",
        "starlette",
        "verifiers environment {}, run by verifiers in its own Python: env.kwargs.python=PATH",
    ),
)

#: Rows ``agentenv envs`` prints for ids that are patterns, not a list: ``(pattern, description)``.
PATTERNS: tuple[tuple[str, str], ...] = (
    ("gym/<ID>", "any Gymnasium environment with spaces.Text observation and action spaces"),
    ("openenv/<NAME>", "an OpenEnv environment server, played over its protocol: env.kwargs.url=http://HOST:PORT"),
    ("verifiers/<NAME>", "a verifiers environment (prime-rl's hub), its own loop and rubric, in its own Python: "
                         "env.kwargs.python=PATH"),
)


def _adapter_for(env_id: str) -> Adapter | None:
    return next((a for a in ADAPTERS if env_id.startswith(a.prefix) and len(env_id) > len(a.prefix)), None)


def _spec(adapter: Adapter, env_id: str) -> EnvSpec | None:
    kwargs = adapter.module().resolve(env_id)
    if kwargs is None:
        return None
    description = adapter.description.format(env_id[len(adapter.prefix):])
    return EnvSpec(id=env_id, entry_point=adapter.entry_point, kwargs=kwargs, description=description)


def resolve(env_id: str) -> EnvSpec | None:
    """Register ``env_id`` when it names an environment of an installed peer; return its spec.

    Returns:
        The registered :class:`~agentenv.registration.EnvSpec`, or None when no installed peer has
        ``env_id`` (the caller raises :class:`~agentenv.errors.EnvNotFound`).
    """
    if env_id in registry:
        return registry[env_id]
    adapter = _adapter_for(env_id)
    if adapter is None or not adapter.installed():
        return None
    found = _spec(adapter, env_id)
    if found is None:
        return None
    return register(env_id, found.entry_point, description=found.description, **found.kwargs)


def add_peers() -> None:
    """The ``agentenv.envs`` entry point of agentenv itself: the peers' ids resolve on first use (:func:`resolve`)."""
    add_resolver("peers", Resolver(resolve, "peers' ids: gym/ID, reasoning_gym/FAMILY, reasoning_gym_tool/FAMILY, "
                                            "gem/ID, textarena/ID, skyrl_gym/ID, openenv/NAME, "
                                            "verifiers/NAME"))


def listed_ids(adapter: Adapter) -> list[str]:
    """The peer ids ``agentenv envs`` lists for ``adapter``, read from the peer (imports it; it must be installed)."""
    mod = adapter.module()
    if adapter.prefix.startswith("reasoning_gym"):
        return mod.families()
    if hasattr(mod, "listed_ids"):
        return mod.listed_ids()
    return []


def built_rows(adapter: Adapter) -> list[listing.Row]:
    """``adapter``'s listing read from the peer itself (imports it): each listed id, its kwargs and its needs."""
    mod = adapter.module()  # every adapter module has resolve(agentenv_id) and needs(peer_id)
    found = ((i, mod.resolve(adapter.prefix + i)) for i in listed_ids(adapter))
    return [listing.Row(i, kwargs, tuple(mod.needs(i))) for i, kwargs in found if kwargs is not None]


def listed_rows(adapter: Adapter) -> list[listing.Row]:
    """``adapter``'s listing: saved for the peer's installed version, else :func:`built_rows` (then saved)."""
    return listing.rows(adapter.prefix.rstrip("/"), adapter.distribution, lambda: built_rows(adapter))


def _listed_spec(adapter: Adapter, row: listing.Row) -> EnvSpec:
    description = adapter.description.format(row.peer_id)
    return EnvSpec(adapter.prefix + row.peer_id, adapter.entry_point, dict(row.kwargs), description)


def installed_specs() -> list[EnvSpec]:
    """Specs of every listed id of every installed peer, for ``agentenv envs``; nothing is registered.

    Read from each peer's saved listing (:func:`listed_rows`): no peer is imported unless its listing
    must be built.
    """
    return [_listed_spec(a, row) for a in ADAPTERS if a.installed() for row in listed_rows(a)]


def unavailable() -> dict[str, str]:
    """Listed ids that cannot be built on this machine -> what each needs and how to get it.

    Checked at each call (a corpus installed after the listing was saved counts), without network access.
    """
    needing = [(a.prefix + r.peer_id, r.needs) for a in ADAPTERS if a.installed() for r in listed_rows(a) if r.needs]
    reasons = {needs: unavailable_reason(needs) for needs in {needs for _, needs in needing}}
    return {env_id: reason for env_id, needs in needing if (reason := reasons[needs])}
