"""A synchronous Gymnasium face for agentenv's asynchronous environments.

:class:`SyncEnv` wraps one :class:`agentenv.core.Env` as a ``gymnasium.Env``: each call runs the
coroutine on a private event loop in a background thread, so it works from plain code and from
inside a running event loop alike (where ``asyncio.run`` would fail).

:func:`register_gymnasium_envs` adds every agentenv id (built-ins and plugins) to Gymnasium's
registry as ``agentenv/<id>`` (a namespaced id ``ns/Name-v0`` becomes ``agentenv/ns.Name-v0``).
``agentenv.register`` adds each id as it is registered, so the built-ins need only ``import agentenv``;
importing this module also loads the plugins and registers theirs. All of these work::

    import agentenv, gymnasium
    env = gymnasium.make("agentenv/python_tool", sandbox_backend="process")
    env = gymnasium.make("agentenv:agentenv/python_tool")               # Gymnasium's module:id form
    env = gymnasium.make("agentenv.gym_adapter:agentenv/examples.GuessNumber-v0")   # a plugin's id

Wall-clock timings (keys the wrapped env lists in ``timing_info_keys``) are moved out of ``info``
into :attr:`SyncEnv.last_timing`: Gymnasium's contract (and its env checker) expects ``info`` to be
a deterministic function of the seed and the actions.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import gymnasium
import numpy as np

from agentenv.core import Env
from agentenv.errors import ClosedError
from agentenv.registration import gym_id

T = TypeVar("T")

class SyncEnv(gymnasium.Env):
    """A ``gymnasium.Env`` that drives an agentenv :class:`~agentenv.core.Env` synchronously.

    Args:
        env: The asynchronous environment; closed by :meth:`close`.

    Attributes:
        last_timing: Timing entries (seconds) removed from the last ``reset``/``step`` info.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, env: Env) -> None:
        self.env = env
        self.observation_space = env.observation_space
        self.action_space = env.action_space
        self.last_timing: dict[str, float] = {}
        self._timing_keys = tuple(env.timing_info_keys)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="agentenv-syncenv", daemon=True)
        self._thread.start()
        self._closed = False

    # Gymnasium's checker reads ``env.unwrapped._np_random``: forward it to the wrapped env's generator.
    @property
    def _np_random(self) -> np.random.Generator | None:  # type: ignore[override]
        return getattr(self.env, "_np_random", None)

    @_np_random.setter
    def _np_random(self, value: np.random.Generator | None) -> None:
        if "env" in self.__dict__:
            self.env._np_random = value

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClosedError("SyncEnv is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _split_info(self, info: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(info)
        self.last_timing = {k: out.pop(k) for k in self._timing_keys if k in out}
        return out

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """``gymnasium.Env.reset``: runs ``await env.reset(seed=seed, options=options)``.

        Raises:
            ClosedError: Called after :meth:`close`.
        """
        obs, info = self._run(self.env.reset(seed=seed, options=options))
        return obs, self._split_info(info)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """``gymnasium.Env.step``: runs ``await env.step(action)`` and unpacks the StepResult.

        Raises:
            ClosedError: Called after :meth:`close`.
            agentenv.errors.ResetNeeded: No episode is running.
        """
        r = self._run(self.env.step(action))
        return r.observation, float(r.reward), bool(r.terminated), bool(r.truncated), self._split_info(r.info)

    def close(self) -> None:
        """Close the wrapped env and stop the private loop. Safe to call twice."""
        if self._closed:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.env.close(), self._loop).result()
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            if not self._thread.is_alive():
                self._loop.close()

    def __repr__(self) -> str:
        return f"<SyncEnv{self.env!r}>"


def make_sync(agentenv_id: str, **kwargs: Any) -> SyncEnv:
    """Gymnasium's entry point of every ``agentenv/<id>``: ``SyncEnv(agentenv.make(agentenv_id, **kwargs))``.

    Raises:
        EnvNotFound / ConfigError: As :func:`agentenv.make`.
    """
    from agentenv.registration import make

    kwargs.pop("render_mode", None)  # no agentenv env renders
    return SyncEnv(make(agentenv_id, **kwargs))


def register_gymnasium_envs() -> list[str]:
    """Register every agentenv id (plugins included: they are loaded) in Gymnasium's registry; idempotent.

    ``agentenv.register`` adds each id as it is registered; this call loads the plugins first, so
    that their ids are there before one of them is made.

    Returns:
        The Gymnasium ids added by this call.
    """
    from agentenv.registration import _register_in_gymnasium, load_plugins, registry

    load_plugins()
    added = []
    for env_id in sorted(registry):
        if gym_id(env_id) not in gymnasium.registry:
            _register_in_gymnasium(env_id)
            added.append(gym_id(env_id))
    return added


register_gymnasium_envs()
