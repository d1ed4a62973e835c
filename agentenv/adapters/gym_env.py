"""``gym/<ID>``: any Gymnasium environment whose observation and action spaces are ``spaces.Text``.

The wrapped environment is built with ``gymnasium.make(ID, **kwargs)``, so its registered wrappers
(``TimeLimit`` from ``max_episode_steps``, order enforcing, the passive checker) are all there and
their flags reach the caller unchanged: Gymnasium's ``terminated`` and ``truncated`` are this
adapter's, the reward is Gymnasium's reward as a float, ``info`` is Gymnasium's ``info``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gymnasium import spaces

from agentenv.core import Env, StepResult
from agentenv.errors import ClosedError, ConfigError, EnvNotFound, ResetNeeded

PREFIX = "gym/"


class GymnasiumEnv(Env[str, str]):
    """A Gymnasium environment with text spaces, played through agentenv's asynchronous contract.

    ``reset(seed=, options=)`` and ``step(action)`` call the Gymnasium env's own methods with the
    same arguments; ``options`` (a task choice included) goes to the Gymnasium env as it is, so an
    env that reads ``options["task"]`` and reports ``info["task_id"]`` keeps doing so. The adapter
    declares no :meth:`tasks` (Gymnasium has no task list). After ``terminated or truncated``,
    ``step`` raises :class:`~agentenv.errors.ResetNeeded` (Gymnasium leaves that undefined).

    Args:
        gym_id: The Gymnasium id (``"ns/Name-v0"``, or ``"module:Name-v0"`` to import a module first).
        in_thread: Run each Gymnasium call in a worker thread (``asyncio.to_thread``), so that a slow
            step never blocks the event loop; False calls it inline (cheaper, for envs known to be fast).
        **make_kwargs: Keyword arguments of ``gymnasium.make`` (the env's own, ``max_episode_steps``, ...).

    Raises:
        EnvNotFound: Gymnasium has no environment ``gym_id``.
        ConfigError: ``gymnasium.make`` rejects ``make_kwargs``, or a space is not ``spaces.Text``.
    """

    cut_turn = "act"
    """Gymnasium's text envs are interactive: a reply cut by the token budget is still the action."""

    def __init__(self, gym_id: str, *, in_thread: bool = True, **make_kwargs: Any) -> None:
        import gymnasium

        try:
            self.gym_env = gymnasium.make(gym_id, **make_kwargs)
        except gymnasium.error.Error as exc:
            if isinstance(exc, (gymnasium.error.NameNotFound, gymnasium.error.NamespaceNotFound,
                                gymnasium.error.VersionNotFound)):
                raise EnvNotFound(f"Gymnasium has no environment {gym_id!r}: {exc}") from exc
            raise ConfigError(f"gymnasium.make({gym_id!r}) failed: {exc}") from exc
        except TypeError as exc:
            raise ConfigError(f"gymnasium.make({gym_id!r}, ...) rejected the keyword arguments: {exc}") from exc
        for name in ("observation_space", "action_space"):
            space = getattr(self.gym_env, name)
            if not isinstance(space, spaces.Text):
                self.gym_env.close()
                raise ConfigError(f"{PREFIX}{gym_id}: the {name} is {space}, not spaces.Text "
                                  "(agentenv plays text environments only)")
        self.gym_id = gym_id
        self.in_thread = in_thread
        self.observation_space = self.gym_env.observation_space
        self.action_space = self.gym_env.action_space
        self._done = True

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self.in_thread:
            return await asyncio.to_thread(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``gym_env.reset(seed=seed, options=options)``; returns its ``(observation, info)``.

        Raises:
            ClosedError: The env is closed.
        """
        if self._closed:
            raise ClosedError(f"{self!r} is closed")
        await super().reset(seed=seed)
        obs, info = await self._call(self.gym_env.reset, seed=seed,
                                     options=dict(options) if options is not None else None)
        self._done = False
        return obs, dict(info)

    async def step(self, action: str) -> StepResult[str]:
        """``gym_env.step(action)``: its 5-tuple as a :class:`StepResult` (reward as float, flags as bool).

        Raises:
            ResetNeeded: No episode is running (never reset, or it ended).
        """
        if self._done:
            raise ResetNeeded("call reset() before step() (the episode is over or never started)")
        obs, reward, terminated, truncated, info = await self._call(self.gym_env.step, action)
        self._done = bool(terminated or truncated)
        return StepResult(obs, float(reward), bool(terminated), bool(truncated), dict(info))

    async def close(self) -> None:
        """Close the Gymnasium env. Safe to call twice."""
        if not self._closed:
            self.gym_env.close()
        await super().close()

    def __repr__(self) -> str:
        return f"<GymnasiumEnv {self.gym_id}>"


def needs(peer_id: str) -> tuple[str, ...]:
    """What the peer's ``peer_id`` needs besides the package (:mod:`agentenv.adapters.needs`): nothing."""
    return ()


def resolve(agentenv_id: str) -> dict[str, Any] | None:
    """Registry keyword arguments for ``gym/<ID>`` when Gymnasium knows ``ID``; None otherwise."""
    import gymnasium

    gym_id = agentenv_id[len(PREFIX):]
    if ":" not in gym_id and gym_id not in gymnasium.registry:
        return None
    return {"gym_id": gym_id}
