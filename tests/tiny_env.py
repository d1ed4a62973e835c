"""A tiny deterministic environment for adapter and checker tests: repeat the number you are shown."""

from __future__ import annotations

from agentenv.core import Env, StepResult, text_space
from agentenv.errors import ResetNeeded


class RepeatNumberEnv(Env[str, str]):
    """Shows "Say N" (N drawn from the env's generator); reward 1.0 when the reply is exactly N."""

    observation_space = text_space(256)
    action_space = text_space(256)

    def __init__(self, high: int = 100, max_tries: int = 2) -> None:
        self.high, self.max_tries = high, max_tries
        self._n: int | None = None
        self._tries = 0
        self.closes = 0

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self._n = int(self.np_random.integers(self.high))
        self._tries = 0
        return f"Say {self._n}", {"n": self._n}

    async def step(self, action):
        if self._n is None:
            raise ResetNeeded("reset first")
        self._tries += 1
        if action.strip() == str(self._n):
            self._n = None
            return StepResult("correct", 1.0, True, False, {"tries": self._tries})
        truncated = self._tries >= self.max_tries
        if truncated:
            self._n = None
        return StepResult("wrong, try again", 0.0, False, truncated, {"tries": self._tries})

    async def close(self):
        self.closes += 1
        await super().close()
