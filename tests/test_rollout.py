"""The agent loop: ids are a plain concatenation, segments carry the right versions, failures are records."""

from __future__ import annotations

import pytest

from agentenv.errors import ConfigError
from agentenv.rollout.episode import RolloutConfig, run_episode
from tests.fakes import EOT, CharRenderer, CountdownEnv, ScriptedEngine


def ids(s: str) -> list[int]:
    return [ord(c) for c in s]


async def test_ids_are_prompt_generated_observation_concatenation():
    engine = ScriptedEngine(["hm", "done"])
    traj = await run_episode(CountdownEnv(), engine, CharRenderer(), RolloutConfig(max_turns=5), seed=3)
    expected = ids("U:task3\nA:") + ids("hm") + [EOT] + ids("U:again1\nA:") + ids("done") + [EOT]
    assert traj.token_ids == expected
    assert traj.loss_mask == [0] * 10 + [1] * 3 + [0] * 11 + [1] * 5
    assert traj.prompt_length == 10
    assert traj.reward == 1.0
    assert traj.info["turns"] == 2 and traj.info["truncation"] is None
    assert traj.task_id == "t3"
    # The engine saw exactly the stored prefix each turn (token in, token out).
    assert engine.calls[1] == expected[: 10 + 3 + 11]
    assert traj.num_policy_tokens == 8
    assert sum(lp for lp, m in zip(traj.behaviour_logprobs, traj.loss_mask, strict=True) if m) == pytest.approx(-4.0)


async def test_interrupted_twice_gives_three_segments_with_versions():
    engine = ScriptedEngine(["abcdefghi"])  # 10 tokens with EOT
    engine.switch_at[0] = [3, 7]  # versions 0 for 3 tokens, 1 for 4, 2 for 3
    traj = await run_episode(CountdownEnv(limit=1), engine, CharRenderer(), RolloutConfig(), seed=0)
    assert [(s.num_tokens, s.version, s.prefix_version) for s in traj.segments] == [(3, 0, 0), (4, 1, 0), (3, 2, 0)]
    assert traj.completion_version == 2
    # GS = (3*2 + 4*1 + 3*0) / 10
    assert traj.generation_staleness() == pytest.approx(1.0)
    assert traj.staleness(5) == pytest.approx(4.0)


async def test_turn_limit_truncates():
    traj = await run_episode(CountdownEnv(), ScriptedEngine(["no"]), CharRenderer(), RolloutConfig(max_turns=3))
    assert traj.info["turns"] == 3 and traj.info["truncation"] == "max_turns"
    assert traj.reward == 0.0 and traj.status == "completed"


async def test_token_budget_counts_what_remains():
    engine = ScriptedEngine(["x" * 50])
    cfg = RolloutConfig(max_turns=10, max_new_tokens_per_turn=100, max_total_tokens=60)
    traj = await run_episode(CountdownEnv(), engine, CharRenderer(), cfg, seed=1)
    # turn 1: 51 tokens; observation "U:again1\nA:" 11 tokens -> 62 used > 60: no budget left.
    assert traj.info["truncation"] == "max_total_tokens"
    assert traj.info["turns"] == 1


async def test_context_limit_truncates_cleanly():
    engine = ScriptedEngine(["no"], max_context_tokens=20)
    traj = await run_episode(CountdownEnv(), engine, CharRenderer(), RolloutConfig(max_turns=9), seed=1)
    assert traj.info["truncation"] == "context"
    assert len(traj.token_ids) <= 20


async def test_environment_that_raises_ends_with_error_record():
    traj = await run_episode(CountdownEnv(raise_on_step=True), ScriptedEngine(["a"]), CharRenderer(), RolloutConfig())
    assert traj.status == "error"
    assert "env exploded" in traj.info["error"]
    assert traj.num_policy_tokens == 2  # what was generated is kept


async def test_engine_that_dies_ends_with_error_record():
    traj = await run_episode(CountdownEnv(), ScriptedEngine(["a"], fail_on=0), CharRenderer(), RolloutConfig())
    assert traj.status == "error" and "engine died" in traj.info["error"]


def test_config_rejects_bad_values():
    with pytest.raises(ConfigError):
        RolloutConfig(max_turns=0)
    with pytest.raises(ConfigError):
        RolloutConfig(top_p=1.5)
