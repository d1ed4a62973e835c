"""Every family of ids ``agentenv envs`` lists trains with a plain ``agentenv train --env ID`` (the generic recipe,
chosen for it) and is evaluated with ``agentenv eval --env ID``: one id of each peer, a tiny model, one update."""

from __future__ import annotations

import json

import gymnasium
import pytest

from agentenv.eval_command import main as eval_main
from agentenv.registration import make
from agentenv.trainer.export import export
from agentenv.trainer.recipe import main as train_main
from tests.adapters.test_gym_env import GYM_ID, SpellBackEnv
from tests.tiny_model_folder import write_tiny_model

FAMILIES = [
    (f"gym/{GYM_ID}", []),
    ("reasoning_gym/gcd", []),
    ("reasoning_gym_tool/gcd", ["env.kwargs.sandbox_backend=process"]),
    ("gem/game:GuessTheNumber-v0", []),
    ("textarena/GuessTheNumber-v0", []),
]
PACKAGES = {"gym": "gymnasium", "reasoning_gym": "reasoning_gym", "reasoning_gym_tool": "reasoning_gym",
            "gem": "gem", "textarena": "textarena"}
SMALL = ["--updates", "1", "run.batch_size=2", "run.concurrency=2", "run.max_pool_size=4",
         "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=8", "rollout.max_total_tokens=96",
         "optim.step_on_zero_gradient=true"]  # a random model's rewards are all equal: the step is the point here


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    gymnasium.register(GYM_ID, entry_point=SpellBackEnv, max_episode_steps=3)
    yield write_tiny_model(tmp_path_factory.mktemp("tiny"))
    gymnasium.registry.pop(GYM_ID, None)


@pytest.mark.parametrize("env_id, extra", FAMILIES, ids=[f[0].partition("/")[0] for f in FAMILIES])
def test_a_listed_id_trains_one_update_and_is_evaluated(tiny, tmp_path, env_id, extra):
    pytest.importorskip(PACKAGES[env_id.partition("/")[0]])
    run = tmp_path / "run"
    assert train_main(["--env", env_id, "--model", str(tiny), "--run-dir", str(run), *SMALL, *extra]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 1 and not summary["interrupted"]
    model = export(run, tmp_path / "model")
    out = tmp_path / "eval"
    kwargs = dict(e.removeprefix("env.kwargs.").split("=") for e in extra)
    env = make(env_id, **kwargs)
    has_tasks = env.tasks() is not None
    await_close(env)
    argv = ["--env", env_id, "--model", str(model), "--max-new-tokens", "8", "--max-steps", "2", "--no-progress",
            "--out", str(out), "--concurrency", "1", *(["--limit", "2"] if has_tasks else ["--seeds", "0:2"])]
    argv += [f"--env-arg={k}={v}" for k, v in kwargs.items()]
    assert eval_main(argv) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["overall"]["episodes"] == 2 and report["overall"]["errors"] == 0
    assert report["protocol"]["tasks"].startswith("first 2 of" if has_tasks else "seeds 0:2")


def await_close(env):
    import asyncio

    asyncio.run(env.close())


def test_a_run_that_makes_no_update_exits_1_with_the_reason(tiny, tmp_path, capsys):
    """A random model never solves gcd: every reward is 0, no batch carries gradient, the one batch allowed
    (run.max_batches=1) is spent and the run ends with 0 of 1 updates."""
    pytest.importorskip("reasoning_gym")
    run = tmp_path / "run"
    small = [a for a in SMALL if a != "optim.step_on_zero_gradient=true"]
    assert train_main(["--env", "reasoning_gym/gcd", "--model", str(tiny), "--run-dir", str(run), *small,
                       "run.max_batches=1"]) == 1
    err = capsys.readouterr().err
    assert "agentenv train: made 0 of the 1 updates asked for: the loop stopped after 1 batches" in err
    assert json.loads((run / "summary.json").read_text())["updates"] == 0
