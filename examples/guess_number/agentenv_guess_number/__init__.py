"""Example agentenv plugin: guess a secret integer from "higher" / "lower" hints.

The package declares ``register_envs`` in the ``agentenv.envs`` entry-point group; agentenv calls it
the first time its registry is read, and ``agentenv.make("examples/GuessNumber-v0")`` then works.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentenv import Env, StepResult, TaskSet, register, text_space
from agentenv.errors import ConfigError, ResetNeeded

ENV_ID = "examples/GuessNumber-v0"


class GuessNumberEnv(Env[str, str]):
    """Guess a secret integer in ``[low, high]``; reward 1.0 for finding it within ``max_turns``.

    Each reply's last integer is the guess; the observation says "higher", "lower" or asks for a
    number. The episode terminates on the right guess and is truncated after ``max_turns`` replies.

    Args:
        low: Smallest possible secret.
        high: Largest possible secret.
        max_turns: Guesses per episode.

    Tasks: :meth:`tasks` lists one task per possible secret, ``low`` first (id ``"secret-<n>"``, no
    kind); ``reset(options={"task": i})`` plays secret ``low + i``, ``options={"secret": n}`` secret ``n``.

    Raises:
        ConfigError: ``low > high`` or ``max_turns < 1``.
    """

    observation_space = text_space(512)
    action_space = text_space(4096)
    system_prompt = "Guess the secret number. Reply with one integer."

    def __init__(self, low: int = 1, high: int = 100, max_turns: int = 7) -> None:
        if low > high or max_turns < 1:
            raise ConfigError(f"need low <= high and max_turns >= 1, got {low}, {high}, {max_turns}")
        self.low, self.high, self.max_turns = low, high, max_turns
        self._secret: int | None = None
        self._turns = 0

    def tasks(self) -> TaskSet:
        """One task per secret from ``low`` to ``high``: ids ``"secret-<n>"``, kinds ``""``."""
        ids = tuple(f"secret-{n}" for n in range(self.low, self.high + 1))
        return TaskSet(ids, ("",) * len(ids))

    async def reset(
        self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Draw a secret from this env's generator; ``options`` ``{"task": i}`` or ``{"secret": n}`` fix it.

        Returns:
            The prompt and ``info["task_id"]`` (``"secret-<n>"``).

        Raises:
            ConfigError: The task index is outside ``[0, high - low]``.
        """
        await super().reset(seed=seed)
        options = options or {}
        if "task" in options:
            task = int(options["task"])
            if not 0 <= task <= self.high - self.low:
                raise ConfigError(f"task {task} is out of range [0, {self.high - self.low}]")
            secret = self.low + task
        elif options.get("secret") is not None:
            secret = int(options["secret"])
        else:
            secret = int(self.np_random.integers(self.low, self.high + 1))
        self._secret = secret
        self._turns = 0
        return f"I am thinking of an integer from {self.low} to {self.high}. Guess it.", {"task_id": f"secret-{secret}"}

    async def step(self, action: str) -> StepResult[str]:
        """Score one guess.

        Raises:
            ResetNeeded: No episode is running.
        """
        if self._secret is None:
            raise ResetNeeded("call reset() first")
        self._turns += 1
        numbers = re.findall(r"-?\d+", action)
        if numbers and int(numbers[-1]) == self._secret:
            self._secret = None
            return StepResult("Correct!", 1.0, True, False, {"turns": self._turns})
        if not numbers:
            obs = "Please reply with an integer."
        else:
            obs = "Higher." if int(numbers[-1]) < self._secret else "Lower."
        truncated = self._turns >= self.max_turns
        if truncated:
            self._secret = None
        return StepResult(obs, 0.0, False, truncated, {"turns": self._turns})


def register_envs() -> None:
    """Entry point of the ``agentenv.envs`` group: register :class:`GuessNumberEnv`."""
    register(
        ENV_ID,
        "agentenv_guess_number:GuessNumberEnv",
        description="Example plugin: guess a secret number from higher/lower hints.",
    )
