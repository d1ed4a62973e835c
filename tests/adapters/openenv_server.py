"""Two small OpenEnv environments for the ``openenv/NAME`` adapter's tests, written against openenv-core's API.

Run with the OpenEnv server's own interpreter (``.venv-openenv/bin/python``, scripts/install_openenv.sh),
never imported by the tests: ``python openenv_server.py {guess,echo} PORT``. Served by OpenEnv's own
``create_app`` on uvicorn, loopback only.

* ``guess``: the typed action ``{"guess": int}`` (a JSON reply); the target is ``seed % 16 + 1``;
  feedback ``higher``/``lower``, reward 1.0 on the target, 4 guesses. A guess of 13 makes the
  environment raise (the server's ``EXECUTION_ERROR``), a failure outside the policy's control.
* ``echo``: the one-string action ``{"message": str}`` (the reply itself); the observation echoes it
  with its length, reward 0.1 per character, never done.
"""

from __future__ import annotations

import sys

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    guess: int = Field(..., description="Your guess, an integer in [1, 16]")


class GuessObservation(Observation):
    feedback: str = Field(default="", description="higher, lower or correct")
    guesses_left: int = Field(default=0, description="Guesses left")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state, self._target, self._left = State(step_count=0), 1, 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> GuessObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        self._target, self._left = (seed or 0) % 16 + 1, 4
        return GuessObservation(feedback="Guess a number in [1, 16].", guesses_left=4, done=False, reward=None)

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        if action.guess == 13:
            raise RuntimeError("the guessing machine broke")
        self._state.step_count += 1
        self._left -= 1
        if action.guess == self._target:
            return GuessObservation(feedback="correct", guesses_left=self._left, done=True, reward=1.0)
        hint = "higher" if action.guess < self._target else "lower"
        return GuessObservation(feedback=hint, guesses_left=self._left, done=self._left == 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state


class EchoAction(Action):
    message: str = Field(..., description="The message to echo")


class EchoObservation(Observation):
    echoed_message: str = Field(default="", description="The message echoed")


class EchoEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> EchoObservation:
        self._state = State(episode_id=episode_id, step_count=0)
        return EchoObservation(echoed_message=f"ready (seed {seed})", done=False, reward=None)

    def step(self, action: EchoAction) -> EchoObservation:  # type: ignore[override]
        self._state.step_count += 1
        return EchoObservation(echoed_message=action.message, done=False, reward=0.1 * len(action.message))

    @property
    def state(self) -> State:
        return self._state


ENVS = {"guess": (GuessEnvironment, GuessAction, GuessObservation),
        "echo": (EchoEnvironment, EchoAction, EchoObservation)}

if __name__ == "__main__":
    kind, port = sys.argv[1], int(sys.argv[2])
    env, action, observation = ENVS[kind]
    app = create_app(env, action, observation, env_name=kind, max_concurrent_envs=4)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
