"""Failed episodes in the real training loop: never in a batch, counted, and a broken env stops the run.

``trainer.train.train()`` runs for real (RolloutCollector, TrajectoryPool, next_batch, the single-process
Learner on a random 2-layer Llama); only the model side is scripted: the ScriptedEngine and
CharRenderer of ``tests.fakes`` and small environments that fail on purpose. Each run takes a few
seconds; every test is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass, replace

import pytest
import torch

from agentenv.errors import AgentEnvError
from agentenv.trainer import recipe, setup
from agentenv.trainer import train as train_loop
from agentenv.trainer.setup import LoopParts
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine, recording_learner

pytestmark = pytest.mark.timeout(120)

OVERRIDES = ["warmup.steps=0", "eval.problems=0", "run.batch_size=4", "run.concurrency=4",
             "run.max_pool_size=8", "run.checkpoint_every=100", "rollout.max_turns=1",
             "rollout.max_new_tokens_per_turn=6", "rollout.max_total_tokens=16", "learner.micro_batch_size=4",
             "staleness.drift_mode=token_share", "objective.delta=100.0"]  # the scripted log-probs are not the model's


def tiny_lm() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


class BrokenResetEnv(CountdownEnv):
    """Every reset raises (a sandbox image that does not exist)."""

    async def reset(self, *, seed=None, options=None):
        raise RuntimeError("reset exploded: no such sandbox image")


class FlakyEnv(CountdownEnv):
    """Fails about 30% of its plays, reproducibly by (seed, play number), three ways in turn:
    reset raises, a prompt longer than the engine's context (no policy token), step raises."""

    plays: dict[int, int] = {}
    failures = 0

    async def reset(self, *, seed=None, options=None):
        k = FlakyEnv.plays[seed] = FlakyEnv.plays.get(seed, 0) + 1
        rng = random.Random(seed * 7919 + k)
        self.mode = rng.randrange(3) if rng.random() < 0.3 else None
        if self.mode is not None:
            FlakyEnv.failures += 1
        if self.mode == 0:
            raise RuntimeError("flaky reset")
        obs, info = await super().reset(seed=seed, options=options)
        return (obs + "x" * 200 if self.mode == 1 else obs), info

    async def step(self, action):
        if self.mode == 2:
            raise RuntimeError("flaky step")
        return await super().step(action)


@dataclass
class Scripted:
    """The loop's scripted model side: ``parts`` for ``train()``, and the batches its learner trained on."""

    batches: list
    parts: LoopParts

    def with_env(self, env) -> LoopParts:
        """``parts`` whose environments are ``env()``."""
        return replace(self.parts, env_factory=lambda cfg, *_: env)


def scripted_parts(batches: list) -> LoopParts:
    """A random 2-layer Llama learner recording its batches, served by a ScriptedEngine to CharRenderer prompts."""
    return LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()),
                     build_engine=lambda cfg, model, tok: ScriptedEngine(["done", "no", "no"], max_context_tokens=64),
                     build_learner=recording_learner(batches),
                     sync_check=lambda cfg: None)  # a scripted engine samples no policy


@pytest.fixture
def scripted():
    """The scripted model side (:class:`Scripted`)."""
    FlakyEnv.plays, FlakyEnv.failures = {}, 0
    batches: list = []
    return Scripted(batches, scripted_parts(batches))


def _train(tmp_path, env, scripted, *extra):
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, *extra])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    return asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=scripted.with_env(env)), 90)), run_dir


@pytest.mark.parametrize("policy", ["pace", "sync"])
def test_a_broken_env_stops_the_run_with_its_error(tmp_path, scripted, policy):
    with pytest.raises(AgentEnvError, match=r"last 16 episodes all failed.*reset exploded: no such sandbox image"):
        _train(tmp_path, BrokenResetEnv, scripted, "--policy", policy, "--updates", "2")
    assert scripted.batches == []  # nothing was ever trained on


@pytest.mark.parametrize("policy", ["pace", "sync"])
def test_a_flaky_env_trains_on_good_episodes_only_and_counts_the_failures(tmp_path, scripted, policy):
    summary, run_dir = _train(tmp_path, FlakyEnv, scripted, "--policy", policy, "--updates", "3")
    batches = scripted.batches
    assert summary["updates"] == 3 and not summary["interrupted"]
    assert len(batches) >= 3 and all(len(b) == 4 for b in batches)  # a batch without gradient takes no step
    assert all(t.status == "completed" and t.num_policy_tokens > 0 and "error" not in t.info
               for b in batches for t in b)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == len(batches) and rows[-1]["update"] == 3
    assert FlakyEnv.failures > 0
    last = rows[-1]
    assert sum(r["episodes/failed"] for r in rows) == last["episodes/failed_total"] == last["episodes/errors"]
    assert last["episodes/failed_total"] >= 1 and last["episodes/failed_total"] <= FlakyEnv.failures
    assert last["episodes/retried_total"] + last["episodes/dropped_tasks_total"] >= 1
    for key in ("episodes/retried", "episodes/dropped_tasks", "episodes/discarded_total"):
        assert key in last


def test_agentenv_train_exits_1_naming_the_error(tmp_path, monkeypatch, capsys):
    # the command line builds its parts from the config: the builders it looks up are replaced
    parts = scripted_parts([])
    for name in ("load_policy", "build_engine", "build_learner"):
        monkeypatch.setattr(setup, name, getattr(parts, name))
    monkeypatch.setattr(setup, "env_factory", lambda cfg, *_: BrokenResetEnv)
    monkeypatch.setattr(recipe, "check_model", lambda name: None)
    rc = recipe.main(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "2"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "agentenv train: the last 16 episodes all failed; the latest with: RuntimeError: reset exploded" in err


def recorded_evaluations(monkeypatch) -> list[str]:
    """Replace the held-out evaluations by a recorder (CountdownEnv has no held-out tasks): the labels run."""
    evaluated: list[str] = []

    async def held_out(cfg, engine, renderer, run_dir, label, stop):
        evaluated.append(label)
        return 0.5

    async def no_tasks(cfg):
        return []

    monkeypatch.setattr(train_loop, "held_out", held_out)
    monkeypatch.setattr(train_loop, "held_out_tasks", no_tasks)
    return evaluated


@pytest.mark.parametrize("user_stop", [False, True])
def test_a_spent_loop_budget_ends_the_run_complete_and_evaluated_and_ctrl_c_does_not(tmp_path, monkeypatch,
                                                                                    scripted, user_stop):
    evaluated = recorded_evaluations(monkeypatch)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "100000",
                                "eval.problems=1"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)

    async def run():
        stop = asyncio.Event()
        if user_stop:  # Ctrl-C before the budget is spent (3 s from train's start: model load included)
            asyncio.get_running_loop().call_later(3.0, stop.set)
        return await train_loop.train(cfg, run_dir, stop=stop, loop_seconds=1.0 if not user_stop else 60.0,
                                  parts=scripted.with_env(CountdownEnv))

    summary = asyncio.run(asyncio.wait_for(run(), 60))
    assert 1 <= summary["updates"] < 100000
    # the budget runs from the loop's start; Ctrl-C's timer from train's, before the model load
    assert summary["train_s"] >= 1.0 if not user_stop else summary["train_s"] < 30
    assert (summary["budget_spent"], summary["interrupted"]) == (not user_stop, user_stop)
    # the "before" evaluation ran before the loop; the one after only when the budget, not Ctrl-C, ended it
    assert evaluated == (["before"] if user_stop else ["before", "after"])


def test_a_resumed_setting_with_no_budget_left_trains_nothing_and_is_evaluated_after(tmp_path, monkeypatch, scripted):
    evaluated = recorded_evaluations(monkeypatch)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "100000",
                                "eval.problems=1", "--policy", "sync"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)

    async def stopped_by_ctrl_c():  # the first process: Ctrl-C (as if during its evaluation after)
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(3.0, stop.set)
        return await train_loop.train(cfg, run_dir, stop=stop, loop_seconds=60.0, parts=scripted.with_env(CountdownEnv))

    first = asyncio.run(asyncio.wait_for(stopped_by_ctrl_c(), 60))
    assert first["interrupted"] and first["updates"] >= 1 and evaluated == ["before"]
    trained = len(scripted.batches)
    evaluated.clear()
    second = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, resume=True, loop_seconds=0.0,
                                                       parts=scripted.with_env(CountdownEnv)), 60))
    # nothing left of the budget: no update, and the run that trained before is evaluated after all
    assert len(scripted.batches) == trained and second["updates"] == first["updates"]
    assert second["budget_spent"] and not second["interrupted"] and evaluated == ["before", "after"]


def test_the_entropy_probe_scores_the_same_rows_after_every_update(tmp_path, scripted):
    probed: list[list[str]] = []  # the trajectory ids of each entropy call
    record = scripted.parts.build_learner

    def probing(cfg, model):
        learner = record(cfg, model)
        entropy = learner.entropy

        def recorded(trajectories):
            probed.append([t.id for t in trajectories])
            return entropy(trajectories)

        learner.entropy = recorded
        return learner

    # a constant lr of 1e-2: the recipe's 1.5e-5 decayed over three updates moves this near-uniform tiny
    # policy's entropy (log 1024) by less than float32 resolves, and the figures would not tell updates apart
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "3",
                                "run.entropy_probe=3", "optim.step_on_zero_gradient=true",
                                "optim.lr=1e-2", "optim.lr_schedule=constant"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    parts = replace(scripted.with_env(CountdownEnv), build_learner=probing)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 90))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary["updates"] == 3 and len(probed) == 3
    # three rows of the first batch, the same ones after every update
    assert probed[0] == [t.id for t in scripted.batches[0][:3]] and probed == [probed[0]] * 3
    figures = [r["probe/policy_entropy"] for r in rows]
    assert all(0 < h < math.log(1024) for h in figures)  # the 1024-token vocabulary bounds it
    assert len(set(figures)) == 3  # the policy changed between updates, the states did not
