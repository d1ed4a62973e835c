"""``rollout.on_prefix_violation=split`` in training: every sample of a split episode reaches the pool.

The template drops earlier assistant turns (``tests/chat_templates/rewriting.jinja``), so each
observation breaks the prefix and starts a new sample. The engine is the real transformers engine on a
tiny random Llama over SmolLM2's tokenizer.
"""

from __future__ import annotations

import json

import pytest

import agentenv
from agentenv.core import Env, StepResult
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.errors import ConfigError
from agentenv.rollout.collector import RolloutCollector
from agentenv.rollout.episode import RolloutConfig
from agentenv.rollout.pool import TrajectoryPool
from agentenv.trainer import recipe, setup
from tests.agents.tiny import rewriting_renderer, tiny_smollm_lm
from tests.smollm_tokenizer import smollm_tokenizer

pytestmark = [pytest.mark.timeout(240)]

TURNS = 3
ENV_ID = "tests/SplitTurns-v0"


class TurnsEnv(Env[str, str]):
    """Answers every reply with a user message; ends after TURNS replies with reward 1 (a game: cut replies act)."""

    observation_role = "user"
    cut_turn = "act"

    def __init__(self, turns: int = TURNS) -> None:
        self.turns = turns

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self.t = 0
        return f"task {seed}", {"task_id": f"t{seed}"}

    async def step(self, action):
        self.t += 1
        return StepResult(f"go on ({self.t})", float(self.t == self.turns), self.t >= self.turns, False, {})


def split_cfg(**kw) -> RolloutConfig:
    return RolloutConfig(max_turns=TURNS, max_new_tokens_per_turn=3, max_total_tokens=200,
                         on_prefix_violation="split", **kw)


async def test_collector_hands_every_sample_on_as_its_own_group():
    engine = TransformersEngine(tiny_smollm_lm(), smollm_tokenizer(), max_batch_size=4, seed=0)
    pool = TrajectoryPool()
    collector = RolloutCollector(TurnsEnv, engine, rewriting_renderer(), split_cfg(), None, on_group=pool.add_group,
                                 concurrency=2)
    out = await collector.collect(4)  # 4 samples asked: 2 episodes of 3 samples are played, all returned
    assert len(out) == 6 and collector.episodes_finished == 2 and collector.episodes_delivered == 6
    for k, traj in enumerate(out):
        assert traj.info["sample"] == k % TURNS and traj.info["samples"] == TURNS
        assert traj.reward == 1.0 and traj.num_policy_tokens == 3 and traj.info["prefix_violations"] == TURNS - 1
    assert [t.info["seed"] for t in out] == [0, 0, 0, 1, 1, 1]
    # asynchronous mode: the pool (groups of 1) gets every sample
    await collector.start()
    while len(pool) < 6:
        await __import__("asyncio").sleep(0.05)
    await collector.close()
    assert all(t.info["samples"] == TURNS for t in pool.trajectories)
    by_seed: dict[int, list[int]] = {}
    for t in pool.trajectories:
        by_seed.setdefault(t.info["seed"], []).append(t.info["sample"])
    assert any(sorted(v) == [0, 1, 2] for v in by_seed.values())
    # a rejected sample puts its task back once: only sample 0 requeues
    collector.requeue(out[1])
    collector.requeue(out[0])
    assert collector.state_dict()["requeued"] == [0]
    await engine.close()


def test_split_with_groups_is_a_config_error():
    with pytest.raises(ConfigError, match="one row per rollout"):
        RolloutCollector(TurnsEnv, None, None, split_cfg(), None, on_group=print, group_size=2)
    with pytest.raises(ConfigError, match="rollout.on_prefix_violation=split"):
        recipe.parse_args(["--recipe", "generic_cpu", "objective.name=grpo", "objective.grpo_group_size=2",
                           "rollout.on_prefix_violation=split"])
    recipe.parse_args(["--recipe", "generic_cpu", "objective.name=grpo", "objective.grpo_group_size=2"])


@pytest.fixture
def split_env():
    agentenv.register(ENV_ID, f"{__name__}:TurnsEnv")
    yield ENV_ID
    agentenv.registry.pop(ENV_ID, None)


@pytest.mark.parametrize("policy", ["sync", "pace"])
def test_training_with_split_consumes_every_sample(split_env, tmp_path, monkeypatch, policy):
    monkeypatch.setattr(setup, "load_policy", lambda cfg, **_: (tiny_smollm_lm(), smollm_tokenizer(),
                                                                 rewriting_renderer()))
    run = tmp_path / "run"
    argv = ["--env", split_env, "--run-dir", str(run), "--policy", policy, "run.updates=2", "run.batch_size=4",
            "run.concurrency=2", "run.max_pool_size=8", "rollout.max_turns=3", "rollout.max_new_tokens_per_turn=3",
            "rollout.max_total_tokens=200", "rollout.on_prefix_violation=split", "learner.micro_batch_size=4",
            "model.max_batch_size=4", "optim.step_on_zero_gradient=true"]
    assert recipe.main(argv) == 0
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 8 and all(c["policy_tokens"] == 3 and c["turns"] == TURNS for c in consumed)
    # the samples of one episode (one seed) are consumed, not only its last one
    seeds = [c["seed"] for c in consumed]
    assert max(seeds.count(s) for s in set(seeds)) >= 2
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2] and all(r["episodes/errors"] == 0 for r in rows)
    assert all(r["chat/prefix_violations"] == 4 * (TURNS - 1) for r in rows)
