"""check_env on a good env, on envs that break one rule each, and on every registered id buildable here."""

from __future__ import annotations

import importlib.util
import random

import pytest

import agentenv
from agentenv.checker import check_env
from agentenv.core import StepResult, TaskSet
from agentenv.errors import EnvCheckError, RegistrationError
from tests.tiny_env import RepeatNumberEnv

ALL_CHECKS = (
    "spaces_and_declarations",
    "step_before_reset_raises",
    "reset_determinism",
    "step_types_and_determinism",
    "step_after_end_raises",
    "close_twice",
)


async def test_tiny_env_passes_every_check() -> None:
    env = RepeatNumberEnv()
    report = await check_env(env, actions=["x"])
    assert report.checks == ALL_CHECKS and report.notes == ()
    assert report.steps == 2 + 2  # determinism pair, then 2 wrong tries truncate
    assert env.closes == 2


class TaskEnv(RepeatNumberEnv):
    """Declares one task per number; ``task_offset`` != 0 plays the wrong one."""

    task_offset = 0

    def tasks(self):
        return TaskSet(tuple(f"n{i}" for i in range(self.high)), ("even", "odd") * (self.high // 2))

    async def reset(self, *, seed=None, options=None):
        obs, info = await super().reset(seed=seed)
        if options and "task" in options:
            self._n = int(options["task"]) + self.task_offset
            obs = f"Say {self._n}"
        return obs, {**info, "task_id": f"n{self._n}"}


class WrongTaskEnv(TaskEnv):
    task_offset = 1


async def test_declared_tasks_are_checked_by_index() -> None:
    report = await check_env(TaskEnv(high=4), actions=["x"])
    assert report.checks == ALL_CHECKS[:3] + ("tasks_by_index",) + ALL_CHECKS[3:]
    with pytest.raises(EnvCheckError, match=r"\{'task': 0\}\) must give info\['task_id'\] == 'n0', got 'n1'"):
        await check_env(WrongTaskEnv(high=4), actions=["x"])


class GlobalRandomEnv(RepeatNumberEnv):
    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self._n = random.randrange(10**9)  # ignores its own generator
        return f"Say {self._n}", {}


class NoResetNeededEnv(RepeatNumberEnv):
    async def step(self, action):
        return StepResult("ok", 0.0, False, False, {})


class NanRewardEnv(RepeatNumberEnv):
    async def step(self, action):
        r = await super().step(action)
        return StepResult(r.observation, float("nan"), r.terminated, r.truncated, r.info)


class BadObsEnv(RepeatNumberEnv):
    async def reset(self, *, seed=None, options=None):
        obs, info = await super().reset(seed=seed)
        return obs + "\x00€", info


class KeepsGoingEnv(RepeatNumberEnv):
    async def step(self, action):
        r = await super().step(action)
        self._n = self._n if self._n is not None else 0
        return r


@pytest.mark.parametrize(
    ("env_cls", "message"),
    [
        (GlobalRandomEnv, "reset\\(seed=s\\) twice"),
        (NoResetNeededEnv, "before reset"),
        (NanRewardEnv, "finite"),
        (BadObsEnv, "not inside observation_space"),
        (KeepsGoingEnv, "after the episode ended"),
    ],
)
async def test_each_broken_rule_is_reported(env_cls, message: str) -> None:
    with pytest.raises(EnvCheckError, match=message):
        await check_env(env_cls(), actions=["x"])


def _buildable(env_id: str) -> bool:
    needs = {"alfworld": "alfworld"}
    return env_id not in needs or importlib.util.find_spec(needs[env_id]) is not None


async def test_every_registered_id_that_can_be_built(data_dir) -> None:
    overrides = {
        "python_tool": {"dataset": "aime24", "sandbox_backend": "process"},
        "alfworld": {"max_steps": 3},
    }
    agentenv.registration.load_plugins()
    # Built-ins and installed plugins (ids that other tests register for themselves are left out).
    ids = sorted(
        i
        for i, spec in agentenv.registry.items()
        if isinstance(spec.entry_point, str) and not spec.entry_point.startswith("tests.")
    )
    assert {"python_tool", "alfworld"} <= set(ids)
    checked, skipped = [], {}
    for env_id in ids:
        try:
            env = agentenv.make(env_id, **overrides.get(env_id, {}))
        except RegistrationError as exc:  # an optional package is missing
            skipped[env_id] = str(exc)
            continue
        report = await check_env(env)
        assert tuple(c for c in report.checks if c != "tasks_by_index")[:4] == ALL_CHECKS[:4], env_id
        if env_id in ("python_tool", "alfworld"):  # both declare their tasks (problems, games)
            assert report.checks[3] == "tasks_by_index", env_id
        checked.append(env_id)
    expected = [i for i in ids if _buildable(i)]
    assert checked == expected, skipped
    assert len(checked) >= 1 + int(_buildable("alfworld"))


def test_the_text_space_holds_any_unicode_text_up_to_its_length() -> None:
    from gymnasium import spaces

    space = agentenv.text_space(8)
    assert isinstance(space, spaces.Text) and space.max_length == 8
    for text in ("", "x = 1", "π ≈ 3.14", "a’b\n\tc", "┌─┐"):
        assert space.contains(text), text
    for bad in ("nine char", "a\x00b", b"bytes", 3):
        assert not space.contains(bad), bad
    assert space == agentenv.text_space(8) and space != agentenv.text_space(9)
    sample = agentenv.text_space(8).sample()  # drawn from printable ASCII and whitespace
    assert space.contains(sample) and set(sample) <= agentenv.core.TEXT_CHARSET


class UnicodeObservationEnv(RepeatNumberEnv):
    """Observes a non-ASCII prompt: an env of the declared text space passes the checker."""

    async def reset(self, *, seed=None, options=None):
        obs, info = await super().reset(seed=seed, options=options)
        return "Répète le nombre: " + obs, info


async def test_an_env_observing_unicode_text_passes_the_checker() -> None:
    report = await check_env(UnicodeObservationEnv(), actions=["x"])
    assert report.checks == ALL_CHECKS
