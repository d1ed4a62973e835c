"""A plugin environment trains and evaluates with a plain command: the trainer knows no env by name.

``examples/GuessNumber-v0`` (the example plugin, registered in-process) has no recipe of its own, so
``agentenv train --env examples/GuessNumber-v0`` runs ``recipes/generic_cpu.yaml``. The policy is a
random 1-layer Llama read through a one-character-per-token renderer (fast on 2 cores); everything
else is the real loop: collector, pool, learner, engine, held-out evaluation.
"""

from __future__ import annotations

import json

import pytest
import torch
import yaml

from agentenv.errors import ConfigError
from agentenv.trainer import recipe, setup
from agentenv.trainer.heldout import evaluate_held_out, held_out_tasks
from tests.fakes import CharRenderer, ScriptedEngine

pytestmark = [pytest.mark.timeout(120)]

FAST = [
    "run.updates=2",
    "run.batch_size=4",
    "run.concurrency=4",
    "run.max_pool_size=8",
    "rollout.max_turns=2",
    "rollout.max_new_tokens_per_turn=4",
    "rollout.max_total_tokens=16",
    "learner.micro_batch_size=4",
    "model.max_batch_size=4",
    "env.kwargs.high=3",
    "env.kwargs.max_turns=2",
    # the plumbing is under test: an update steps although a random policy's rewards may all be equal
    "optim.step_on_zero_gradient=true",
]


def tiny_lm() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=1024,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
    )
    return transformers.LlamaForCausalLM(cfg).eval()


def test_train_a_plugin_env_without_a_recipe(guess_number, tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "load_policy", lambda cfg, **_: (tiny_lm(), None, CharRenderer()))
    run = tmp_path / "run"
    assert recipe.main(["--env", guess_number, "--run-dir", str(run), *FAST, "eval.problems=3"]) == 0
    cfg = check_two_update_guess_number_run(run, {"id": guess_number, "kwargs": {"high": 3, "max_turns": 2},
                                                   "eval_kwargs": {}, "remote": None})
    assert cfg["warmup"]["steps"] == 0 and cfg["run"]["updates"] == 2
    for label in ("before", "after"):
        assert len(json.loads((run / f"eval_{label}.json").read_text())["outcomes"]) == 3
    assert "eval/delta" in json.loads((run / "summary.json").read_text())


def check_two_update_guess_number_run(run, env: dict) -> dict:
    """Assert what a 2-update GuessNumber(high=3) run with 3 held-out tasks left in ``run``; return its config.

    ``config.yaml`` holds ``env`` (with the default ``step_latency``, off, unless ``env`` names one);
    2 updates, no failed episode, 8 trajectories of the 3 secrets consumed; held-out reports of the 3
    tasks at versions 0 and 2, no errors; not interrupted.
    """
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["env"] == {"step_latency": {"median_s": 0.0, "sigma": 0.0}, **env}
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2] and all(r["episodes/errors"] == 0 for r in rows)
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 8 and {c["task_id"] for c in consumed} <= {"secret-1", "secret-2", "secret-3"}
    for label, version in (("before", 0), ("after", 2)):
        report = json.loads((run / f"eval_{label}.json").read_text())
        assert report["task_ids"] == ["secret-1", "secret-2", "secret-3"] and report["version"] == version
        assert report["episodes"] == 3 and report["errors"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 2 and not summary["interrupted"]
    return cfg


def test_a_warm_up_the_env_cannot_serve_fails_before_the_model_loads(guess_number, tmp_path, monkeypatch, capsys):
    def no_model(cfg, **_):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(setup, "load_policy", no_model)
    assert recipe.main(["--env", guess_number, "--run-dir", str(tmp_path / "r"), "warmup.steps=2"]) == 1
    assert (
        f"warmup.steps=2 needs scripted demonstrations, which environment '{guess_number}' does not provide"
        in capsys.readouterr().err
    )
    # so do constructor arguments the env does not take, before the run folder exists: the message lists the
    # ones it takes
    assert recipe.main(["--env", guess_number, "--run-dir", str(tmp_path / "s"), "env.kwargs.dataset=x"]) == 2
    assert "does not take 'dataset'; it takes: low, high, max_turns" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


async def test_held_out_evaluation_plays_each_declared_task(guess_number):
    cfg, _ = recipe.parse_args(
        [
            "--env",
            guess_number,
            "eval.problems=4",
            "env.kwargs.high=9",
            "env.eval_kwargs.low=5",
        ]
    )
    _, tasks = await held_out_tasks(cfg)
    assert tasks.ids == ("secret-5", "secret-6", "secret-7", "secret-8") and tasks.kinds == ("",) * 4
    report = await evaluate_held_out(cfg, ScriptedEngine(["I say 6"]), CharRenderer(), label="before",
                                     samples_per_task=2)
    assert report.task_ids == tasks.ids and report.outcomes == (0.0, 1.0, 0.0, 0.0)
    assert (report.tasks, report.episodes, report.errors, report.success_rate) == (4, 8, 0, 0.25)


def test_check_warmup_knows_the_hook_not_the_env_name(guess_number):
    cfg, _ = recipe.parse_args(["--env", guess_number, "warmup.steps=1"])
    with pytest.raises(ConfigError, match="set warmup.steps=0"):
        setup.check_warmup(cfg)
    setup.check_warmup(recipe.parse_args(["--env", guess_number])[0])  # steps 0: nothing to serve
    setup.check_warmup(recipe.parse_args(["--recipe", "python_tool_cpu"])[0])  # python_tool has demonstrations
