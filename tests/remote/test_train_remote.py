"""A real training update against a remote environment: ``env.remote`` in the recipe, the env on a server.

The served env (the example plugin) is not even registered in the training process: everything the
trainer needs comes over HTTP. The policy is a random 1-layer Llama read through a one-character
renderer (as in ``tests/trainer/test_plugin_env.py``); the collector, pool, learner, engine and the
held-out evaluation are the real ones.
"""

from __future__ import annotations

import httpx
import pytest

import agentenv
from agentenv.trainer import recipe, setup
from tests.fakes import CharRenderer
from tests.remote.serving import GUESS_NUMBER_ID, running
from tests.trainer.test_plugin_env import check_two_update_guess_number_run, tiny_lm

pytestmark = [pytest.mark.timeout(180)]

FAST = [
    "run.updates=2", "run.batch_size=4", "run.concurrency=4", "run.max_pool_size=8",
    "rollout.max_turns=2", "rollout.max_new_tokens_per_turn=4", "rollout.max_total_tokens=16",
    "learner.micro_batch_size=4", "model.max_batch_size=4",
    "optim.step_on_zero_gradient=true",  # the plumbing is under test: a random policy's rewards may all be equal
]


@pytest.mark.parametrize("form", ["override", "flag", "flag without --env"])
def test_train_against_a_remote_env(tmp_path, monkeypatch, form):
    """``env.remote=URL`` with a recipe named, or ``--env-remote URL`` alone (the generic recipe is chosen;
    without ``--env`` the env the server serves)."""
    assert GUESS_NUMBER_ID not in agentenv.registry
    monkeypatch.setattr(setup, "load_policy", lambda cfg, **_: (tiny_lm(), None, CharRenderer()))
    run = tmp_path / "run"
    with running("--env-arg", "high=3", "--env-arg", "max_turns=2") as server:
        where = ["--recipe", "generic_cpu", f"env.remote={server.url}"] if form == "override" else \
            ["--env-remote", server.url]
        named = [] if form == "flag without --env" else ["--env", GUESS_NUMBER_ID]
        argv = [*named, "--run-dir", str(run), *FAST, *where, "eval.problems=3"]
        assert recipe.main(argv) == 0
        health = httpx.get(server.url + "/health", timeout=10).json()
    assert GUESS_NUMBER_ID not in agentenv.registry  # never built in this process
    # the task ids come from the server's env (high=3), so the episodes were played there
    remote = server.url if form == "override" else [server.url]
    check_two_update_guess_number_run(run, {"id": GUESS_NUMBER_ID, "kwargs": {}, "eval_kwargs": {},
                                            "remote": remote})
    assert health["sessions"] == 0  # every episode's session was closed
