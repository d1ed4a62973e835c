"""``check_env``: does an environment keep the :class:`agentenv.core.Env` contract?

In the manner of Gymnasium's ``utils/env_checker.py``, for asynchronous text environments:

1. spaces are Gymnasium spaces; ``observation_role`` is ``"user"`` or ``"tool"``; tools are
   function schemas with a name;
2. ``step`` before ``reset`` raises :class:`~agentenv.errors.ResetNeeded` (give it a fresh env);
3. ``reset(seed=s)`` returns ``(observation, dict)`` with the observation inside the space; the
   same seed gives the same observation and generator state, and the unseeded reset after it is
   reproducible too; another seed gives another generator state;
   if ``tasks()`` declares a :class:`~agentenv.core.TaskSet`, ``reset(options={"task": i})`` puts
   ``ids[i]`` in ``info["task_id"]`` (first and last task);
4. ``step`` returns a :class:`~agentenv.core.StepResult` with a finite float reward, bool flags,
   a mapping ``info`` and an observation inside the space; the same seed and action give the same
   result (timing keys the env lists in ``timing_info_keys`` excepted);
5. an episode played to its end (bounded by ``max_steps``) refuses another ``step`` with
   ``ResetNeeded``;
6. ``close()`` twice is safe.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gymnasium import spaces

from agentenv.core import Env, StepResult, TaskSet
from agentenv.errors import EnvCheckError, ResetNeeded


@dataclass(frozen=True)
class CheckReport:
    """What :func:`check_env` verified.

    Attributes:
        env: ``repr`` of the checked environment.
        checks: Names of the checks that passed, in order.
        steps: Steps played in total.
        notes: Checks that could not be run and why (e.g. no episode ended within ``max_steps``).
    """

    env: str
    checks: tuple[str, ...]
    steps: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def _fail(what: str) -> None:
    raise EnvCheckError(what)


def _check_obs(env: Env, obs: Any, where: str) -> None:
    if not env.observation_space.contains(obs):
        _fail(
            f"{where}: observation {str(obs)[:80]!r} is not inside observation_space {env.observation_space}"
        )


def _check_step_result(env: Env, r: Any, where: str) -> None:
    if not isinstance(r, StepResult):
        _fail(f"{where}: step() returned {type(r).__name__}, expected StepResult")
    _check_obs(env, r.observation, where)
    if isinstance(r.reward, bool) or not isinstance(r.reward, (int, float)) or not math.isfinite(r.reward):
        _fail(f"{where}: reward {r.reward!r} is not a finite number")
    if not isinstance(r.terminated, bool) or not isinstance(r.truncated, bool):
        _fail(f"{where}: terminated/truncated must be bool, got {r.terminated!r}/{r.truncated!r}")
    if not isinstance(r.info, Mapping):
        _fail(f"{where}: info must be a mapping, got {type(r.info).__name__}")


def _comparable(env: Env, r: StepResult) -> tuple[Any, ...]:
    skip = set(env.timing_info_keys)
    info = {k: v for k, v in r.info.items() if k not in skip}
    return (r.observation, float(r.reward), r.terminated, r.truncated, info)


def _rng_state(env: Env) -> Any:
    return env.np_random.bit_generator.state


async def _check_tasks(env: Env, seed: int) -> bool:
    """Whether the env declares tasks (checking them if it does: first and last by index)."""
    tasks = env.tasks()
    if tasks is None:
        return False
    if not isinstance(tasks, TaskSet) or not len(tasks):
        _fail(f"tasks() must return None or a non-empty TaskSet, got {tasks!r:.120}")
    for i in dict.fromkeys((0, len(tasks) - 1)):
        _, info = await env.reset(seed=seed, options={"task": i})
        if info.get("task_id") != tasks.ids[i]:
            _fail(f"reset(options={{'task': {i}}}) must give info['task_id'] == {tasks.ids[i]!r}, "
                  f"got {info.get('task_id')!r}")
    return True


async def check_env(
    env: Env,
    *,
    seed: int = 123,
    actions: Sequence[Any] | None = None,
    max_steps: int = 100,
    close: bool = True,
) -> CheckReport:
    """Check that a *fresh* environment keeps the Env contract (see the module docstring).

    Args:
        env: A newly built environment (never reset).
        seed: Seed of the determinism checks.
        actions: Actions to play, cycled; default samples from ``env.action_space`` (seeded).
        max_steps: Most steps of the play-to-the-end check.
        close: Run the close-twice check at the end (the env is closed afterwards).

    Returns:
        A :class:`CheckReport`.

    Raises:
        EnvCheckError: The first broken rule, with what was expected.
    """
    checks: list[str] = []
    notes: list[str] = []
    steps = 0

    # 1. declared attributes
    if not isinstance(env.observation_space, spaces.Space) or not isinstance(env.action_space, spaces.Space):
        _fail("observation_space and action_space must be gymnasium spaces")
    if env.observation_role not in ("user", "tool"):
        _fail(f"observation_role must be 'user' or 'tool', got {env.observation_role!r}")
    for tool in env.tools:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            _fail(f"tool schema without a function name: {tool!r}")
    checks.append("spaces_and_declarations")

    # 2. step before reset
    sample_space = env.action_space
    sample_space.seed(seed)
    action_list = list(actions) if actions else None

    def action(i: int) -> Any:
        return action_list[i % len(action_list)] if action_list else sample_space.sample()

    try:
        await env.step(action(0))
    except ResetNeeded:
        checks.append("step_before_reset_raises")
    else:
        _fail("step() before reset() must raise ResetNeeded")

    # 3. seeded reset determinism
    out = await env.reset(seed=seed)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        _fail(f"reset() must return (observation, dict), got {out!r:.120}")
    obs1, _ = out
    _check_obs(env, obs1, "reset(seed)")
    state1 = _rng_state(env)
    obs2, _ = await env.reset()
    _check_obs(env, obs2, "reset()")
    obs3, _ = await env.reset(seed=seed)
    if obs3 != obs1 or _rng_state(env) != state1:
        _fail("reset(seed=s) twice gave different observations or generator states")
    obs4, _ = await env.reset()
    if obs4 != obs2:
        _fail("reset(seed=s) then reset() is not reproducible")
    await env.reset(seed=seed + 1)
    if _rng_state(env) == state1:
        _fail("different seeds gave the same generator state (does reset call super().reset(seed=seed)?)")
    checks.append("reset_determinism")
    if await _check_tasks(env, seed):
        checks.append("tasks_by_index")

    # 4. step types and determinism
    a = action(1)
    await env.reset(seed=seed)
    r1 = await env.step(a)
    _check_step_result(env, r1, "step")
    await env.reset(seed=seed)
    r2 = await env.step(a)
    steps += 2
    if _comparable(env, r1) != _comparable(env, r2):
        _fail("the same seed and action gave different step results")
    checks.append("step_types_and_determinism")

    # 5. play to the end, then step must refuse
    await env.reset(seed=seed)
    done = False
    for i in range(max_steps):
        r = await env.step(action(2 + i))
        steps += 1
        _check_step_result(env, r, f"step {i + 1}")
        if r.terminated or r.truncated:
            done = True
            break
    if done:
        try:
            await env.step(action(0))
        except ResetNeeded:
            checks.append("step_after_end_raises")
        else:
            _fail("step() after the episode ended must raise ResetNeeded")
    else:
        notes.append(f"no episode ended within {max_steps} steps; step-after-end not checked")

    # 6. close twice
    if close:
        await env.close()
        await env.close()
        checks.append("close_twice")
    return CheckReport(repr(env), tuple(checks), steps, tuple(notes))
