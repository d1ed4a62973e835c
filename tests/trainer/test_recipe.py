"""The training recipe: config errors, run-folder safety, and one real end-to-end update on the CPU default."""

from __future__ import annotations

import json

import pytest

from agentenv.errors import ConfigError, RunFolderError
from agentenv.trainer.recipe import main, parse_args, prepare_run_dir
from agentenv.trainer.resume import ensure_run_id


def test_overrides_reach_the_typed_config():
    cfg, _ = parse_args(["--updates", "3", "--optim.lr", "1e-5", "rollout.max_turns=5", "--policy", "max_lag"])
    assert cfg.run.updates == 3 and cfg.optim.lr == 1e-5 and cfg.rollout.max_turns == 5
    assert cfg.staleness.policy == "max_lag"
    assert parse_args(["--policy", "sync"])[0].staleness.policy == "sync"
    # a run folder's config that still holds run.mode loads when it says async, the one mode it could hold
    assert parse_args(["run.mode=async"])[0] == parse_args([])[0]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["optim.lr=fast"], "optim.lr"),
        (["run.batchsize=4"], "unknown field"),
        (["--recipe", "nope"], "unknown recipe"),
        (["run.mode=sync"], "run.mode is no longer a setting: it is fixed at 'async' .staleness.policy=sync "
                            "alternates generation and training"),
        (["run.max_pool_size=2"], "max_pool_size"),
    ],
)
def test_bad_configs_fail_with_a_clear_error(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_args(argv)


def test_unknown_env_is_a_clear_error(tmp_path, capsys):
    rc = main(["--env", "no_such_env", "--recipe", "python_tool_cpu", "--run-dir", str(tmp_path / "r"),
               "warmup.steps=0", "--updates", "1"])
    assert rc == 2
    assert "no environment 'no_such_env'" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_print_config_refuses_an_env_argument_the_run_would_refuse(tmp_path, capsys):
    argv = ["--env", "python_tool", "--run-dir", str(tmp_path / "r"), "env.kwargs.no_such_arg=1"]
    assert main([*argv, "--print-config"]) == 2
    assert "does not take 'no_such_arg'" in capsys.readouterr().err
    assert main(argv) == 2 and not (tmp_path / "r").exists()
    assert main(["--env", "python_tool", "env.kwargs.max_turns=3", "--print-config"]) == 0
    assert "max_turns: 3" in capsys.readouterr().out


def test_overwrite_never_deletes_a_folder_that_is_not_a_run(tmp_path, capsys):
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("\\documentclass{article}")
    assert main(["--run-dir", str(mine), "--overwrite", "--updates", "1"]) == 2
    assert "not an agentenv training run folder" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--env", "no_such_env"], "unknown environment 'no_such_env' (registered environments: "),
        (["--recipe", "/nonexistent/r.yaml"], "recipe file '/nonexistent/r.yaml' does not exist"),
        (["--model", "/nonexistent/model"], "model folder '/nonexistent/model' does not exist"),
    ],
)
def test_command_line_mistakes_fail_before_a_run_folder_exists(tmp_path, capsys, argv, needle):
    assert main(argv + ["--run-dir", str(tmp_path / "run")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_run_folder_is_never_overwritten_silently(tmp_path):
    cfg, _ = parse_args(["--run-dir", str(tmp_path / "run")])
    run = prepare_run_dir(cfg, resume=False, overwrite=False)
    ensure_run_id(run)  # what train writes once the model has loaded: the folder is a run's from here
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunFolderError, match="--overwrite"):
        prepare_run_dir(cfg, resume=False, overwrite=False)
    assert (run / "metrics.jsonl").read_text() == "{}\n"
    prepare_run_dir(cfg, resume=False, overwrite=True)
    assert not (run / "metrics.jsonl").exists()
    with pytest.raises(RunFolderError, match="holds no run"):
        prepare_run_dir(parse_args(["--run-dir", str(tmp_path / "empty")])[0], resume=True, overwrite=False)


@pytest.mark.slow
def test_two_async_updates_with_the_default_model_then_resume(tmp_path):
    run = tmp_path / "run"
    common = ["--run-dir", str(run), "warmup.steps=1", "run.batch_size=2", "run.concurrency=2",
              "run.max_pool_size=4", "rollout.max_new_tokens_per_turn=24", "rollout.max_total_tokens=64",
              "env.kwargs.sandbox_backend=process", "eval.problems=2",
              # this test is about the plumbing (files, versions, resume): every batch takes its step,
              # also one whose two rewards happen to be equal (which carries no gradient)
              "optim.step_on_zero_gradient=true"]
    assert main(common + ["--updates", "2"]) == 0
    before = json.loads((run / "eval_before.json").read_text())
    after = json.loads((run / "eval_after.json").read_text())
    assert (before["version"], after["version"]) == (0, 2)
    assert before["episodes"] == after["episodes"] == 2 and before["errors"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval/before"] == before["success_rate"] and summary["eval/after"] == after["success_rate"]
    assert 0 < summary["train_s"] < summary["wall_clock_s"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]
    # peak RSS is the process's high-water mark (pytest's, here: other tests count too, so no bound;
    # the default run's memory is measured by benchmarks/bench_learner_memory.py and BENCHMARKS.md)
    peaks = [r["memory/peak_rss_gb"] for r in rows] + [summary["peak_rss_gb"]]
    assert 0 < peaks[0] and peaks == sorted(peaks)
    assert all(0 < r["engine/busy_share"] <= 1 for r in rows)
    # the engine decodes the learner's parameters in place (nothing is copied), and the entropy probe
    # still measures the policy after every step: nats per token, under ln(49152) for this vocabulary
    assert [r["sync/bytes"] for r in rows] == [0.0, 0.0]
    assert all(0 < r["probe/policy_entropy"] < 10.81 for r in rows)
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 4  # B = 2 trajectories per update
    assert all(c["gs"] >= 0 and c["ws"] >= 0 for c in consumed)
    assert (run / "checkpoints" / "latest").read_text().strip().endswith("00002")
    for name in ("reward.png", "gs_hist.png", "ws_hist.png", "pool.png"):
        assert (run / "plots" / name).stat().st_size > 1000
    # --resume continues with the same version numbering
    assert main(common + ["--updates", "3", "--resume"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert json.loads((run / "summary.json").read_text())["updates"] == 3
    assert json.loads((run / "eval_before.json").read_text()) == before  # not re-run on resume
    assert json.loads((run / "eval_after.json").read_text())["version"] == 3


def test_resume_keeps_the_saved_config_except_what_its_command_line_says(tmp_path):
    import yaml

    from agentenv.configio import to_dict
    from agentenv.trainer.recipe import resumed_config

    run = tmp_path / "run"
    saved, _ = parse_args(["--run-dir", str(run), "--updates", "7", "run.batch_size=4", "optim.lr=3e-6"])
    prepare_run_dir(saved, resume=False, overwrite=False)
    assert not any(run.iterdir())  # nothing written before the model has loaded: a failed start blocks nothing
    prepare_run_dir(saved, resume=False, overwrite=False)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(saved)))
    _, args = parse_args(["--run-dir", str(run), "--resume", "--updates", "9"])
    cfg = resumed_config(run, args.overrides)
    assert (cfg.run.updates, cfg.run.batch_size, cfg.optim.lr) == (9, 4, 3e-6)  # recipe defaults do not creep in
    _, args = parse_args(["--run-dir", str(run), "--resume"])
    assert resumed_config(run, args.overrides).run.updates == 7
    with pytest.raises(RunFolderError, match="without --resume"):
        resumed_config(tmp_path / "nothing", [])


async def test_held_out_evaluation_is_cancelled_by_stop_and_writes_nothing(tmp_path, monkeypatch):
    import asyncio

    from agentenv.trainer import train as train_loop

    started = asyncio.Event()

    async def forever(*args, **kwargs):
        started.set()
        await asyncio.sleep(3600)

    monkeypatch.setattr(train_loop, "evaluate_held_out", forever)
    cfg, _ = parse_args([])
    stop = asyncio.Event()
    task = asyncio.ensure_future(train_loop.held_out(cfg, None, None, tmp_path, "before", stop))
    await asyncio.wait_for(started.wait(), 5)
    stop.set()
    assert await asyncio.wait_for(task, 5) is None
    assert not (tmp_path / "eval_before.json").exists()


async def test_a_run_whose_episodes_all_fail_stops_with_the_error():
    import asyncio
    from types import SimpleNamespace

    from agentenv.errors import AgentEnvError
    from agentenv.trainer.batch_wait import failure_limit, next_batch

    cfg, _ = parse_args(["run.concurrency=2"])
    from agentenv.rollout.collector import NoUpdateWatch

    collector = SimpleNamespace(failure_streak=failure_limit(2), last_error="sandbox: no such image",
                                no_update_watch=lambda: NoUpdateWatch(300.0, lambda: "no episodes"))
    learner = SimpleNamespace(score=None)
    with pytest.raises(AgentEnvError, match=r"last 16 episodes all failed.*no such image"):
        await asyncio.wait_for(next_batch([], learner, cfg, asyncio.Event(), print, collector), 5)
    collector.failure_streak -= 1  # one below the limit: it keeps waiting for a batch
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(next_batch([], learner, cfg, asyncio.Event(), print, collector), 0.3)


@pytest.mark.parametrize("summary, expected", [
    ({"updates": 3}, None),  # all asked for
    ({"updates": 1, "interrupted": True}, None),  # Ctrl-C has its own status
    ({"updates": 0, "interrupted": True}, None),
    ({"updates": 2, "budget_spent": True}, None),  # a time budget that allowed some updates
    ({"updates": 0, "budget_spent": True}, "made 0 of the 3 updates asked for: the time budget ran out"),
    ({"updates": 2}, "made 2 of the 3 updates asked for: the loop stopped after 12 batches"),
])
def test_shortfall_says_why_a_run_failed(summary, expected):
    from agentenv.trainer.setup import shortfall

    cfg, _ = parse_args(["--updates", "3"])  # run.max_batches unset: 4 x 3 batches
    reason = shortfall(cfg, summary)
    assert reason is None if expected is None else reason.startswith(expected)
