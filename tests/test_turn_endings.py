"""How each turn ended, and what a turn cut by a token budget does: never graded unless the env asks."""

from __future__ import annotations

from typing import ClassVar

import pytest

from agentenv.core import StepResult
from agentenv.engines.base import GenerationOutput, TokenSpan
from agentenv.rollout.episode import RolloutConfig, is_token_budget_cut, run_episode, turn_ending
from tests.fakes import EOT, CharRenderer, CountdownEnv, ScriptedEngine


class RamblingEngine(ScriptedEngine):
    """Never samples the end-of-turn token: every reply runs to its token budget."""

    async def generate(self, prompt_ids, params):
        self.calls.append(list(prompt_ids))
        text = self.replies[(len(self.calls) - 1) % len(self.replies)]
        ids = [ord(c) for c in (text * 100)][: params.max_new_tokens]
        return GenerationOutput(ids, [-0.5] * len(ids), [TokenSpan(len(ids), 0, 0)], "length")


class GradedEnv(CountdownEnv):
    """Pays 1.0 for any reply containing 'done' (a grader that would accept a cut answer)."""

    stepped: list[str]

    async def reset(self, *, seed=None, options=None):
        self.stepped = []
        return await super().reset(seed=seed, options=options)

    async def step(self, action):
        self.stepped.append(action)
        return await super().step(action)


class GameEnv(GradedEnv):
    cut_turn: ClassVar[str] = "act"


def out(ids, finish="length"):
    return GenerationOutput(ids, [-1.0] * len(ids), [TokenSpan(len(ids), 0, 0)], finish)


def test_turn_ending_names_each_budget():
    stop = (EOT,)
    assert turn_ending(out([5, EOT], "stop"), stop, budget=8, per_turn=8, context_left=100) == "end_of_turn"
    assert turn_ending(out([5, 6], "stop"), stop, budget=8, per_turn=8, context_left=100) == "stop"
    assert turn_ending(out([5] * 8), stop, budget=8, per_turn=8, context_left=100) == "max_new_tokens_per_turn"
    assert turn_ending(out([5] * 3), stop, budget=3, per_turn=8, context_left=100) == "max_total_tokens"
    assert turn_ending(out([5] * 3), stop, budget=3, per_turn=8, context_left=3) == "context"


async def test_cut_reply_is_not_graded_by_an_env_that_ends():
    env = GradedEnv()
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=6)
    traj = await run_episode(env, RamblingEngine(["done "]), CharRenderer(), cfg, seed=0)
    # "done d" holds the winning word, but it was cut by the budget: the env never saw it.
    assert env.stepped == []
    assert traj.reward == 0.0
    assert traj.info["truncation"] == "max_new_tokens_per_turn"
    assert traj.info["turn_endings"] == ["max_new_tokens_per_turn"]
    assert is_token_budget_cut(traj)


async def test_cut_reply_is_played_by_an_env_that_acts_and_the_turn_is_closed():
    env = GameEnv(limit=10)
    cfg = RolloutConfig(max_turns=3, max_new_tokens_per_turn=4)
    traj = await run_episode(env, RamblingEngine(["go "]), CharRenderer(), cfg, seed=0)
    assert env.stepped == ["go g", "go g", "go g"]  # the game went on after each cut turn
    assert traj.info["turns"] == 3 and traj.info["truncation"] == "max_turns"
    assert traj.info["turn_endings"] == ["max_new_tokens_per_turn"] * 3
    # After each cut turn the loop closes it with EOT as an environment token (no policy gradient).
    first_obs = traj.prompt_length + 4
    assert traj.token_ids[first_obs] == EOT and traj.loss_mask[first_obs] == 0
    assert traj.num_policy_tokens == 12


def test_a_renderer_inherits_the_protocol_defaults():
    renderer = CharRenderer()  # subclasses agentenv.rollout.episode.Renderer and declares neither member
    assert (renderer.end_of_turn_id, renderer.tool_parser_name) == (EOT, None)


async def test_a_cut_turn_is_closed_with_the_renderers_end_of_turn_token():
    class OtherEnd(CharRenderer):
        stop_token_ids = (EOT, 999)
        end_of_turn_id = 999  # a template whose turn ends with a token other than the first stop token

    cfg = RolloutConfig(max_turns=2, max_new_tokens_per_turn=4)
    traj = await run_episode(GameEnv(limit=10), RamblingEngine(["go "]), OtherEnd(), cfg, seed=0)
    first_obs = traj.prompt_length + 4
    assert traj.token_ids[first_obs] == 999 and traj.loss_mask[first_obs] == 0


async def test_cut_by_the_total_budget_ends_after_acting():
    env = GameEnv(limit=10)
    cfg = RolloutConfig(max_turns=5, max_new_tokens_per_turn=8, max_total_tokens=5)
    traj = await run_episode(env, RamblingEngine(["done"]), CharRenderer(), cfg, seed=0)
    assert env.stepped == ["doned"] and traj.reward == 1.0  # the game asked to see it, and it won
    assert traj.info["truncation"] == "max_total_tokens"


async def test_a_closed_reply_is_graded_as_before():
    env = GradedEnv()
    traj = await run_episode(env, ScriptedEngine(["done"]), CharRenderer(), RolloutConfig(), seed=0)
    assert env.stepped == ["done"] and traj.reward == 1.0
    assert traj.info["turn_endings"] == ["end_of_turn"] and not is_token_budget_cut(traj)


async def test_unknown_cut_turn_policy_is_an_error_record():
    class Odd(GradedEnv):
        cut_turn: ClassVar[str] = "sometimes"

    traj = await run_episode(Odd(), ScriptedEngine(["x"]), CharRenderer(), RolloutConfig(), seed=0)
    assert traj.status == "error" and "cut_turn" in traj.info["error"]


@pytest.mark.parametrize("env_id,expected", [("python_tool", "end"), ("alfworld", "act")])
def test_shipped_envs_declare_their_cut_turn_policy(env_id, expected):
    from agentenv.errors import RegistrationError
    from agentenv.registration import spec

    try:
        cls = spec(env_id).load()
    except RegistrationError as exc:  # alfworld is an optional install
        pytest.skip(f"{env_id} is not importable here: {exc}")
    assert cls.cut_turn == expected


def test_step_result_is_gymnasiums_five_tuple():
    r = StepResult("o", 1.0, True, False, {"k": 2})
    assert tuple(r) == ("o", 1.0, True, False, {"k": 2})
    # what Gymnasium users index: env.step(a)[0] raised TypeError while StepResult was a dataclass
    assert (r[0], r[1], r[2], r[3], r[4]) == ("o", 1.0, True, False, {"k": 2}) and r[-1] == {"k": 2}
    assert isinstance(r, tuple) and len(r) == 5 and r[:2] == ("o", 1.0)
    assert (r.observation, r.reward, r.terminated, r.truncated) == ("o", 1.0, True, False)
    obs, reward, terminated, truncated, info = StepResult("x", 0.0, False, True)
    assert (obs, reward, terminated, truncated, dict(info)) == ("x", 0.0, False, True, {})
    with pytest.raises(TypeError):  # the default info is read-only: no episode can leak into another's
        StepResult("x", 0.0, False, False).info["k"] = 1
