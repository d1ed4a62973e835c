"""``agentenv study``: the studies as data, the table from hand-written run folders, bad input, and
(slow) one real ``--quick`` study with the embedded model, then its resume."""

from __future__ import annotations

import json
import math
import time

import pytest

from agentenv.errors import ConfigError, DataError, RunFolderError
from agentenv.trainer.experiments.significance import paired_bootstrap
from agentenv.trainer.experiments.studies import STUDIES, WALL_CLOCK_S, Setting, Study
from agentenv.trainer.experiments.study import (
    get_study,
    list_studies,
    main,
    run_study,
    setting_configs,
    study_markdown,
    study_row,
    table,
    wilson_interval,
)


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_wilson_interval_against_hand_computed_values():
    # 7 of 10: centre (0.7 + 1.92/10) / 1.384 = 0.6446, half 1.96 sqrt(0.021 + 0.00960) / 1.384 = 0.2477
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.3968, abs=1e-4) and high == pytest.approx(0.8922, abs=1e-4)
    low, high = wilson_interval(0, 20)  # no successes: a one-sided interval from 0, not [0, 0]
    assert low == 0.0 and high == pytest.approx(0.1611, abs=1e-4)
    assert wilson_interval(5, 5)[1] == 1.0
    for bad in ((3, 0), (-1, 5), (6, 5)):
        with pytest.raises(DataError):
            wilson_interval(*bad)


def _fake_setting(run, success, tools):
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"updates": 3, "train_s": 30.04, "wall_clock_s": 61.26}))
    _jsonl(run / "metrics.jsonl", [
        {"update": u, "train/batches": u, "reward/mean": r, "tools/calls": t, "length/policy_tokens": 40 + u,
         "learner/admitted_fraction": 1.0, "learner/admitted_token_fraction": 0.4 + u / 10, "learner/mean_d": 0.01,
         "length/truncated": u / 4,
         "pool/rejected": 0, "engine/busy_share": 0.5}
        for u, r, t in zip((1, 2, 3), (0.25, 0.5, 0.75), tools, strict=True)])
    _jsonl(run / "staleness.jsonl", [{"gs": 0, "ws": 1}] * 12)
    for label, rate in (("before", 0.25), ("after", success)):
        outcomes = [1.0] * round(rate * 8) + [0.0] * (8 - round(rate * 8))
        (run / f"eval_{label}.json").write_text(json.dumps({
            "success_rate": rate, "outcomes": outcomes, "tool_calls_mean": 0.5, "version": 3}))


def test_row_and_table_from_run_folders(tmp_path):
    study = STUDIES["signed_feedback"]
    _fake_setting(tmp_path / "a", 0.5, (1.0, 2.0, 0.0))
    _fake_setting(tmp_path / "b", 0.875, (0.0, 0.0, 0.5))
    row = study_row(study, "a", tmp_path / "a")
    lo, hi = wilson_interval(4, 8)
    # before 2 of 8, after 4 of 8, the first tasks succeeding: tasks 2 and 3 go 0 -> 1, a gain of 2/8
    gain = paired_bootstrap([1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0])
    assert gain.delta == 0.25
    g_ci = [round(gain.low, 4), round(gain.high, 4)]
    assert row == {"setting": "a", "tool_calls": 1.0, "success_after": 0.5,
                   "success_after_ci95": [round(lo, 4), round(hi, 4)], "tool_calls_after": 0.5,
                   "reward_last5": 0.5, "gain": 0.25, "gain_ci95": g_ci, "vs_first": None, "vs_first_ci95": None,
                   "wall_clock_s": 61.3, "train_s": 30.0, "updates": 3, "rollouts": 12,
                   "shared_from": None, "before_shared_from": None}
    row_b = study_row(study, "b", tmp_path / "b", reference=tmp_path / "a")
    # b's after 7 of 8 against a's after 4 of 8, task by task: tasks 4, 5, 6 go 0 -> 1
    assert (row_b["gain"], row_b["vs_first"]) == (0.625, 0.375)
    vs = paired_bootstrap([1, 1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0])
    assert row_b["vs_first_ci95"] == [round(vs.low, 4), round(vs.high, 4)] and vs.low > 0
    md = table(study, [row, row_b]).splitlines()
    assert md[0] == ("| setting | tool_calls | success_after | tool_calls_after | reward_last5 | gain | vs_first "
                     "| wall_clock_s | train_s | updates | rollouts |")
    assert md[2] == (f"| a | 1.0 | 0.500 [{lo:.3f}, {hi:.3f}] | 0.5 | 0.5 | +0.250 [{g_ci[0]:+.3f}, {g_ci[1]:+.3f}] "
                     "| (reference) | 61.3 | 30.0 | 3 | 12 |")
    assert md[3].startswith("| b | 0.1667 | 0.875 [") and "| +0.375 [" in md[3]


def _write_eval(run, label, task_ids, outcomes):
    (run / f"eval_{label}.json").write_text(json.dumps({
        "success_rate": sum(outcomes) / len(outcomes), "task_ids": task_ids, "outcomes": outcomes,
        "tool_calls_mean": 1.0, "version": 3}))


def test_paired_differences_pair_by_task_id_and_refuse_other_tasks(tmp_path):
    study = STUDIES["entropy_filter"]
    for name in ("ref", "x"):
        _fake_setting(tmp_path / name, 0.5, (1.0, 1.0, 1.0))
    _write_eval(tmp_path / "ref", "after", ["t0", "t1", "t2", "t3"], [1.0, 1.0, 0.0, 0.0])
    # the same tasks listed in another order: paired by id, t0 and t1 keep succeeding, t2 is gained
    _write_eval(tmp_path / "x", "after", ["t3", "t2", "t1", "t0"], [0.0, 1.0, 1.0, 1.0])
    _write_eval(tmp_path / "x", "before", ["t0", "t1", "t2", "t3"], [1.0, 1.0, 1.0, 1.0])
    row = study_row(study, "x", tmp_path / "x", reference=tmp_path / "ref")
    assert row["vs_first"] == 0.25 and row["vs_first_ci95"][0] == 0.0  # one task of four: 0 is in the interval
    assert row["gain"] == -0.25 and row["gain_ci95"][1] == 0.0  # t3 is lost
    # other tasks, or a task listed twice: n/a with the reason (study.md says it), the rest of the row kept
    for ids in (["t0", "t1", "t2", "u3"], ["t0", "t1", "t2", "t2"]):
        _write_eval(tmp_path / "x", "after", ids, [1.0, 1.0, 1.0, 0.0])
        row = study_row(study, "x", tmp_path / "x", reference=tmp_path / "ref")
        assert row["vs_first"] is None and row["success_after"] == 0.75
        assert "not of the same tasks" in row["paired_error"] or "repeated" in row["paired_error"]
    md = study_markdown(study, {"scale": "s", "rows": [row]})
    assert "Not paired (n/a): `x`: " in md and "| n/a |" in md


def test_a_wall_clock_setting_counts_its_loop_seconds_over_sessions(tmp_path):
    from agentenv.trainer.experiments.study import _add_loop_seconds, loop_seconds_spent

    run = tmp_path / "r"
    run.mkdir()
    assert loop_seconds_spent(run) == 0.0
    for train_s in (250.5, 200.0):  # two sessions, each stopped by Ctrl-C and resumed
        started = time.time() - 1.0
        (run / "summary.json").write_text(json.dumps({"train_s": train_s}))
        _add_loop_seconds(run, since=started)
    assert loop_seconds_spent(run) == 450.5  # the third process gets 600 - 450.5 s, not 600 - 200
    # a process stopped before it wrote a summary (Ctrl-C while torch loaded) adds nothing: the
    # second process's summary is older than it and is not counted twice
    _add_loop_seconds(run, since=time.time() + 1.0)
    assert loop_seconds_spent(run) == 450.5


def test_the_gate_study_row_reports_the_token_share_and_the_lag(tmp_path):
    _fake_setting(tmp_path / "g", 0.5, (1.0, 1.0, 1.0))
    row = study_row(STUDIES["gate_under_lag"], "g", tmp_path / "g")
    # reward 0.25, 0.5, 0.75: population std 0.2041; token shares 0.5, 0.6, 0.7; every record GS 0 + WS 1
    assert [row[k] for k in ("mean_d", "reward_std", "admitted", "admitted_tokens", "lag_mean")] == [
        0.01, 0.2041, 1.0, 0.6, 1.0]
    assert list(row)[:7] == ["setting", "mean_d", "reward_std", "admitted", "admitted_tokens", "lag_mean",
                             "success_after"]


def test_the_normaliser_study_reports_turns_and_the_length_of_late_failures(tmp_path):
    study = STUDIES["loss_normaliser"]
    _fake_setting(tmp_path / "a", 0.5, (1.0, 1.0, 1.0))
    row = study_row(study, "a", tmp_path / "a")
    assert row["failed_tokens"] is None and row["turns"] is None  # not recorded: n/a
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    _jsonl(tmp_path / "a" / "metrics.jsonl", [{**json.loads(x), "length/turns": t}
                                             for x, t in zip(lines, (1, 2, 4), strict=True)])
    # versions 0..6, two trajectories each: a failure of 100 + v tokens and a success of 10 tokens
    _jsonl(tmp_path / "a" / "staleness.jsonl", [{"gs": 0, "ws": 1, "version": v, **r} for v in range(7) for r in (
        {"reward": 0.0, "policy_tokens": 100 + v}, {"reward": 1.0, "policy_tokens": 10})])
    row = study_row(study, "a", tmp_path / "a")
    assert row["turns"] == round(7 / 3, 4)
    assert row["failed_tokens"] == 104.0  # the failures of versions 2..6: 102..106 tokens
    assert list(row)[:8] == ["setting", "failed_tokens", "turns", "truncated", "response_tokens", "success_after",
                             "success_after_ci95", "tool_calls"]


def test_the_length_study_reports_the_truncated_share_and_n_a_for_runs_that_did_not_log_it(tmp_path):
    study = STUDIES["sample_vs_token_mean"]
    _fake_setting(tmp_path / "a", 0.5, (1.0, 1.0, 1.0))
    row = study_row(study, "a", tmp_path / "a")
    assert (row["response_tokens"], row["truncated"]) == (42.0, 0.5)  # 41, 42, 43 tokens; 1/4, 2/4, 3/4 cut
    lines = (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()
    _jsonl(tmp_path / "a" / "metrics.jsonl", [{k: v for k, v in json.loads(x).items() if k != "length/truncated"}
                                             for x in lines])
    row = study_row(study, "a", tmp_path / "a")
    assert row["truncated"] is None and "| n/a |" in table(study, [row])


def test_the_staleness_studies_plot_the_gs_and_ws_distributions(tmp_path):
    from agentenv.trainer.experiments.study import plot_study

    for name, ws in (("sync", 0), ("async_none", 2)):
        _fake_setting(tmp_path / name, 0.5, (1.0, 1.0, 1.0))
        _jsonl(tmp_path / name / "staleness.jsonl", [{"gs": i % 3 * 0.5, "ws": ws} for i in range(12)])
    study = STUDIES["staleness_wall_clock"]
    rows = [study_row(study, n, tmp_path / n) for n in ("sync", "async_none")]
    written = plot_study(study, tmp_path, ["sync", "async_none"], rows)
    assert [p.name for p in written] == ["reward.png", "tool_calls.png", "figure_success_after.png", "staleness.png"]
    assert (tmp_path / "plots" / "staleness.png").stat().st_size > 5000
    assert rows[1]["ws_mean"] == 2.0 and rows[1]["gs_mean"] == 0.5  # GS 0, 0.5, 1 in turn
    one = plot_study(STUDIES["entropy_filter"], tmp_path, ["sync"], rows[:1])
    assert "staleness.png" not in [p.name for p in one]  # a study not about staleness has no such plot


def test_a_run_without_held_out_evaluation_says_n_a(tmp_path):
    _fake_setting(tmp_path / "a", 0.5, (1.0, 1.0, 1.0))
    for p in tmp_path.glob("a/eval_*.json"):
        p.unlink()
    row = study_row(STUDIES["one_vs_group"], "a", tmp_path / "a")
    assert row["success_after"] is None and row["success_after_ci95"] is None
    assert "| n/a |" in table(STUDIES["one_vs_group"], [row])


def test_every_runnable_study_builds_valid_configs_with_equal_budgets(tmp_path):
    runnable = [s for s in STUDIES.values() if not s.not_runnable]
    assert [s.name for s in runnable] == ["one_vs_group", "signed_feedback", "sample_vs_token_mean",
                                          "gate_under_lag", "staleness_wall_clock",
                                          "staleness_wall_clock_latency", "loss_normaliser", "entropy_filter"]
    for study in runnable:
        configs = setting_configs(study, tmp_path, quick=False)
        assert len(configs) == len(study.settings) >= 2
        assert {c.env.kwargs["dataset"] for _, c in configs} == {"tool_expr_train"}
        assert {c.env.eval_kwargs["dataset"] for _, c in configs} == {"tool_expr_eval"}
        assert len({(c.run.updates, c.run.batch_size) for _, c in configs}) == 1  # equal rollouts
        assert [c.run.run_dir for _, c in configs] == [str(tmp_path / s.name) for s in study.settings]
    cfgs = dict(setting_configs(STUDIES["one_vs_group"], tmp_path, quick=False))
    (_, flash), (_, grpo) = list(cfgs.items())
    assert (flash.objective.name, grpo.objective.name, grpo.objective.grpo_group_size) == ("flash_reinforce", "grpo", 4)
    signed = [c.objective.advantage_clip_negative for _, c in setting_configs(STUDIES["signed_feedback"], tmp_path,
                                                                           quick=False)]
    assert signed == [False, True]
    means = setting_configs(STUDIES["sample_vs_token_mean"], tmp_path, quick=False)
    assert [c.objective.loss_aggregation for _, c in means] == ["sample_mean", "token_mean"]
    gates = setting_configs(STUDIES["gate_under_lag"], tmp_path, quick=False)
    assert [(s.name, c.objective.gate, c.objective.is_truncation, c.staleness.forced_lag, c.staleness.policy)
            for s, c in gates] == [
        ("sequence_gate", "sequence", None, 4, "none"), ("token_mask", "token", None, 4, "none"),
        ("no_gate", "none", None, 4, "none"), ("no_gate_tis", "none", 2.0, 4, "none")]
    from agentenv.trainer.learners.backends import loss_constant

    normalisers = setting_configs(STUDIES["loss_normaliser"], tmp_path, quick=False)
    assert [(c.objective.loss_aggregation, loss_constant(c)) for _, c in normalisers] == [
        ("sample_mean", None), ("constant", 384)]  # min(4 turns x 96 tokens, 512)
    assert {(c.env.kwargs["max_turns"], c.rollout.max_turns) for _, c in normalisers} == {(4, 4)}
    quick = setting_configs(STUDIES["loss_normaliser"], tmp_path, quick=True)
    assert [loss_constant(c) for _, c in quick] == [None, 96]  # 4 turns x 24 tokens
    assert [c.objective.gate for _, c in setting_configs(STUDIES["gate_under_lag"], tmp_path, quick=True)] == [
        "sequence", "token"]
    for name, latency in (("staleness_wall_clock", (0.0, 0.0)), ("staleness_wall_clock_latency", (2.0, 1.0))):
        wall = setting_configs(STUDIES[name], tmp_path, quick=False)
        assert [(c.staleness.policy, c.staleness.drift_mode) for _, c in wall] == [
            ("sync", "token_share"), ("none", "token_share"), ("max_lag", "token_share"),
            ("pace", "token_share"), ("pace", "scoring")]
        # the same 200 held-out problems as the equal-updates studies, evaluated after the budget
        assert {(c.env.step_latency.median_s, c.env.step_latency.sigma, c.eval.problems) for _, c in wall} == {
            (*latency, 200)}
        assert STUDIES[name].figures[0] == "success_after"
        assert STUDIES[name].seconds == WALL_CLOCK_S == 600.0
    quick = setting_configs(STUDIES["entropy_filter"], tmp_path, quick=True)
    assert [c.objective.entropy_keep_fraction for _, c in quick] == [None, 0.9]
    assert {(c.run.updates, c.run.batch_size, c.eval.problems) for _, c in quick} == {(2, 4, 4)}


def test_bad_input_is_a_clear_error_before_anything_runs(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match="unknown study 'nope'; known studies: one_vs_group, signed_feedback"):
        get_study("nope")
    later = Study("later", "a claim", (Setting("a", ()), Setting("b", ())), ("mean_d",), not_runnable="no mechanism")
    monkeypatch.setitem(STUDIES, "later", later)
    with pytest.raises(ConfigError, match="study 'later' cannot run yet: no mechanism"):
        get_study("later")
    assert "later                        NOT YET RUNNABLE: no mechanism" in list_studies()
    monkeypatch.delitem(STUDIES, "later")
    with pytest.raises(ConfigError, match="setting grpo_n4 cannot apply: a GRPO group of 4 rollouts"):
        run_study("one_vs_group", tmp_path / "s", quick=True, overrides=["run.concurrency=2"])
    with pytest.raises(ConfigError, match="setting grpo_n4: .*multiple of objective.grpo_group_size"):
        run_study("one_vs_group", tmp_path / "s", quick=True, overrides=["run.batch_size=6"])
    assert not (tmp_path / "s").exists()
    other = tmp_path / "other"
    other.mkdir()
    (other / "study.json").write_text(json.dumps({"study": "entropy_filter", "quick": True}))
    with pytest.raises(RunFolderError, match="holds study 'entropy_filter', not 'signed_feedback'"):
        run_study("signed_feedback", other, quick=True, resume=True)
    with pytest.raises(RunFolderError, match="holds a --quick run of entropy_filter"):
        run_study("entropy_filter", other, quick=False, resume=True)
    with pytest.raises(RunFolderError, match="pass --resume"):
        run_study("entropy_filter", other, quick=True)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("run: {}\n")
    with pytest.raises(RunFolderError, match="not a study folder"):
        run_study("entropy_filter", tmp_path / "run", quick=True)
    with pytest.raises(RunFolderError, match="holds no study"):
        run_study("entropy_filter", tmp_path / "empty", quick=True, resume=True)
    assert main(["nope"]) == 2
    assert "known studies: one_vs_group" in capsys.readouterr().err


def test_a_wall_clock_study_has_seconds_and_an_equal_updates_study_updates():
    from agentenv.trainer.experiments import study

    assert study.budget(STUDIES["staleness_wall_clock"], quick=False) == (None, 600.0)
    assert study.budget(STUDIES["signed_feedback"], quick=True) == (2, None)
    assert study.budget(STUDIES["signed_feedback"], quick=False) == (None, None)


def test_every_setting_keeps_the_default_lr_schedule(tmp_path):
    # the recipe's horizon: a wall-clock setting that sets no run.updates of its own warms up over 4
    # updates and decays over 24, as the default does (an unbounded horizon would keep its lr near 0)
    from agentenv.trainer.lr_schedule import warmup_length

    for name in ("staleness_wall_clock", "signed_feedback"):
        for _, cfg in setting_configs(STUDIES[name], tmp_path, quick=False):
            assert (cfg.run.updates, warmup_length(cfg.optim, cfg.run.updates)) == (24, 4)


def _finished_setting(run, cfg, seconds=None, *, success=0.5):
    """A hand-written finished setting with ``cfg``'s config.yaml and key (and a checkpoint folder)."""
    import yaml

    from agentenv.configio import to_dict
    from agentenv.trainer.experiments.study_share import setting_key

    _fake_setting(run, success, (1.0, 1.0, 0.0))
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "weights.bin").write_bytes(b"0" * 64)
    (run / "study_setting.json").write_text(json.dumps({"finished": True, "key": setting_key(cfg, seconds)}))


def test_a_finished_identical_setting_is_copied_from_a_sibling_study_not_rerun(tmp_path):
    from agentenv.trainer.experiments.study_share import find_finished, setting_key

    (_, full), (_, positive) = setting_configs(STUDIES["signed_feedback"], tmp_path / "a", quick=True)
    _finished_setting(tmp_path / "a" / "full_baseline", full, success=0.625)
    _finished_setting(tmp_path / "a" / "positive_only", positive, success=0.25)
    # another budget, another config: not the same experiment
    assert find_finished(tmp_path, setting_key(full, 90.0), exclude=tmp_path / "b") is None
    assert find_finished(tmp_path, setting_key(full, None), exclude=tmp_path / "a" / "full_baseline") is None
    log: list[str] = []
    result = run_study("signed_feedback", tmp_path / "b", quick=True, log=log.append)  # nothing trains
    assert [(r["setting"], r["shared_from"], r["success_after"]) for r in result["rows"]] == [
        ("full_baseline", "a/full_baseline", 0.625), ("positive_only", "a/positive_only", 0.25)]
    assert not (tmp_path / "b" / "full_baseline" / "checkpoints").exists()  # logs and reports, not weights
    marker = json.loads((tmp_path / "b" / "positive_only" / "study_setting.json").read_text())
    assert marker["shared_from"] == "a/positive_only" and marker["key"] == setting_key(positive, None)
    assert "`full_baseline` is the run `a/full_baseline` (the same config and budget), copied" in (
        tmp_path / "b" / "study.md").read_text()
    assert any("1/2 full_baseline: the same config and budget as" in m for m in log)
    # entropy_filter's no_filter is the same config as full_baseline (the recipe's defaults): copied too
    (_, no_filter), _ = setting_configs(STUDIES["entropy_filter"], tmp_path / "c", quick=True)
    found = find_finished(tmp_path, setting_key(no_filter, None), exclude=tmp_path / "c")
    assert found == tmp_path / "a" / "full_baseline"


def test_the_before_evaluation_is_shared_only_from_a_run_that_starts_from_the_same_policy(tmp_path):
    import dataclasses

    from agentenv.trainer.experiments.study_share import before_key, find_before

    (_, full), (_, positive) = setting_configs(STUDIES["signed_feedback"], tmp_path, quick=True)
    _finished_setting(tmp_path / "s" / "full_baseline", full)
    assert find_before(tmp_path, positive, exclude=tmp_path / "s" / "positive_only") == tmp_path / "s" / "full_baseline"
    assert find_before(tmp_path, full, exclude=tmp_path / "s" / "full_baseline") is None  # not itself
    lag = dataclasses.replace(positive, staleness=dataclasses.replace(positive.staleness, forced_lag=4))
    assert before_key(lag) == before_key(full)  # what comes after the start does not matter
    # a greedy evaluation of the warm-up's policy (its seed is fixed) is the same for every run seed
    assert full.eval.temperature == 0
    assert before_key(dataclasses.replace(full, run=dataclasses.replace(full.run, seed=1))) == before_key(full)
    sampled = dataclasses.replace(full, eval=dataclasses.replace(full.eval, temperature=0.7))
    for other in (dataclasses.replace(full, warmup=dataclasses.replace(full.warmup, steps=2)),
                  dataclasses.replace(full, eval=dataclasses.replace(full.eval, problems=3)), sampled,
                  dataclasses.replace(sampled, run=dataclasses.replace(full.run, seed=1))):
        assert before_key(other) != before_key(full)
        assert find_before(tmp_path, other, exclude=tmp_path / "x") is None
    assert before_key(dataclasses.replace(sampled, run=dataclasses.replace(full.run, seed=1))) != before_key(sampled)
    (tmp_path / "s" / "full_baseline" / "eval_before.json").write_text('{"success_rate": 0.')  # killed mid-write
    assert find_before(tmp_path, positive, exclude=tmp_path / "x") is None


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_quick_study_writes_real_figures_and_resumes_without_rerunning(tmp_path):
    root = tmp_path / "study"
    log: list[str] = []
    fewer = ["eval.problems=2"]  # --quick's 4 held-out problems, halved to keep this test near 3 minutes
    result = run_study("signed_feedback", root, quick=True, overrides=fewer, log=log.append)
    assert [r["setting"] for r in result["rows"]] == ["full_baseline", "positive_only"]
    on_disk = json.loads((root / "study.json").read_text())
    assert on_disk["rows"] == result["rows"] and not on_disk["interrupted"]
    for row in result["rows"]:
        run = root / row["setting"]
        summary = json.loads((run / "summary.json").read_text())
        metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        after = json.loads((run / "eval_after.json").read_text())
        assert row["updates"] == summary["updates"] == 2
        assert row["rollouts"] == 2 * 4  # 2 updates of B = 4
        assert row["tool_calls"] == round(sum(m["tools/calls"] for m in metrics) / len(metrics), 4)
        assert row["success_after"] == after["success_rate"] and after["tasks"] == 2
        lo, hi = row["success_after_ci95"]
        assert (lo, hi) == tuple(round(x, 4) for x in wilson_interval(sum(after["outcomes"]), 2))
        assert 0 <= lo <= row["success_after"] <= hi <= 1 and hi - lo > 0.5  # 2 tasks: a wide interval
        assert (run / "study_setting.json").is_file()
    # the second setting starts from the same policy: its "before" evaluation is the first one's, copied
    names = ("full_baseline", "positive_only")
    rates = [json.loads((root / s / "eval_after.json").read_text())["success_rate"] for s in names]
    assert result["rows"][0]["vs_first"] is None and result["rows"][1]["vs_first"] == round(rates[1] - rates[0], 4)
    first, second = (json.loads((root / s / "eval_before.json").read_text()) for s in names)
    assert second.pop("shared_from") == "study/full_baseline" and second == first
    assert [r["before_shared_from"] for r in result["rows"]] == [None, "study/full_baseline"]
    walls = [json.loads((root / s / "summary.json").read_text())["wall_clock_s"] for s in names]
    assert [r["wall_clock_s"] for r in result["rows"]] == [round(walls[0], 1), round(walls[1] + first["seconds"], 1)]
    assert any("2/2 positive_only: held-out 'before' evaluation" in m and "copied from" in m for m in log)
    import yaml

    assert yaml.safe_load((root / "positive_only" / "config.yaml").read_text())["objective"]["advantage_clip_negative"]
    md = (root / "study.md").read_text()
    assert "model SmolLM2-135M-Instruct (embedded)" in md and "B = 4, 2 updates per setting, 2 held-out" in md
    assert f"| full_baseline | {result['rows'][0]['tool_calls']} |" in md
    for name in ("reward.png", "tool_calls.png", "figure_tool_calls.png"):
        assert (root / "plots" / name).stat().st_size > 5000
        assert f"plots/{name}" in result["plots"] and f"](plots/{name})" in md
    assert (root / "plots" / "tool_calls.png").read_bytes() != (root / "plots" / "reward.png").read_bytes()
    assert any("1/2 full_baseline: training to 2 updates" in m for m in log)

    # a second invocation: the finished settings are kept, the half-finished one resumes with train's --resume
    (root / "positive_only" / "study_setting.json").unlink()
    kept = (root / "full_baseline" / "metrics.jsonl").stat().st_mtime_ns
    log.clear()
    again = run_study("signed_feedback", root, quick=True, resume=True, overrides=fewer, log=log.append)
    assert any("1/2 full_baseline: finished before, kept" in m for m in log)
    assert any("2/2 positive_only: resuming" in m for m in log)
    assert (root / "full_baseline" / "metrics.jsonl").stat().st_mtime_ns == kept
    assert again["rows"][0] == result["rows"][0]
    assert again["rows"][1]["updates"] == 2 and again["rows"][1]["rollouts"] == 8  # nothing trained twice
    assert not math.isnan(again["rows"][1]["reward_last5"])


def test_study_all_runs_every_runnable_study_in_its_folder_and_resumes_only_those_started(tmp_path, monkeypatch):
    from agentenv.trainer.experiments import study

    calls = []

    def fake_run_study(name, root, *, quick, resume, overrides, share):
        calls.append((name, root, resume, share))
        return {"rows": [], "interrupted": name == "staleness_wall_clock"}  # Ctrl-C in the fifth study

    monkeypatch.setattr(study, "run_study", fake_run_study)
    (tmp_path / "signed_feedback").mkdir()
    (tmp_path / "signed_feedback" / "study.json").write_text("{}")
    assert main(["all", "--resume", "--run-dir", str(tmp_path), "--no-share"]) == 130
    assert calls == [("one_vs_group", tmp_path / "one_vs_group", False, False),
                     ("signed_feedback", tmp_path / "signed_feedback", True, False),
                     ("sample_vs_token_mean", tmp_path / "sample_vs_token_mean", False, False),
                     ("gate_under_lag", tmp_path / "gate_under_lag", False, False),
                     ("staleness_wall_clock", tmp_path / "staleness_wall_clock", False, False)]
    calls.clear()
    assert main(["entropy_filter", "--quick", "--resume"]) == 0  # one study: --resume as given
    assert calls == [("entropy_filter", study.Path("runs/study/entropy_filter-quick"), True, True)]


def test_a_setting_stopped_before_its_first_checkpoint_is_trained_again_keeping_its_before(tmp_path):
    from dataclasses import replace

    import yaml

    from agentenv.configio import to_dict
    from agentenv.trainer.experiments import study

    (setting, cfg), _ = setting_configs(STUDIES["signed_feedback"], tmp_path / "s", quick=True)
    run = tmp_path / "s" / setting.name
    assert not study._nothing_to_resume(run)  # not started
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg)))
    (run / "metrics.jsonl").write_text('{"version": 1}\n')  # an update logged, killed before checkpoint 10
    (run / "eval_before.json").write_text('{"success_rate": 0.49}')
    assert study._nothing_to_resume(run)
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("v00000010")
    (run / "checkpoints" / "v00000010").mkdir()
    assert not study._nothing_to_resume(run)  # a checkpoint: train's --resume continues from it
    (run / "checkpoints" / "latest").unlink()
    log: list[str] = []
    study._start_setting(cfg, run, tmp_path, log=log.append, head="h")
    assert sorted(p.name for p in run.iterdir()) == ["eval_before.json"]  # the rest of the old run is gone
    assert (run / "eval_before.json").read_text() == '{"success_rate": 0.49}' and log == []
    # one of another policy (here: another model) is not kept
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(replace(cfg, model=replace(cfg.model, name="other")))))
    study._start_setting(cfg, run, tmp_path, log=log.append, head="h")
    assert not (run / "eval_before.json").exists()


def test_a_setting_s_process_is_told_how_to_continue_and_a_stop_ends_the_study(tmp_path, monkeypatch):
    from agentenv.trainer.experiments import study

    seen = []

    def stopped(cfg, run_dir, *, resume, seconds, head, then):
        seen.append((run_dir.name, resume, seconds, head, then))
        return False, True  # Ctrl-C during the first setting

    monkeypatch.setattr(study, "train_in_child", stopped)
    result = run_study("signed_feedback", tmp_path / "s", quick=True, share=False, log=lambda m: None)
    assert result["interrupted"] and result["rows"] == []
    assert seen == [("full_baseline", False, None, "[study signed_feedback] 1/2 full_baseline",
                     "run the same command with --resume")]


def test_a_setting_started_again_replaces_its_own_folder_whatever_it_holds(tmp_path):
    """A setting folder whose run stopped before train wrote run.json (only a copied evaluation in it) is the
    study's own: starting the setting again empties it, where train's --overwrite would refuse it."""
    from agentenv.trainer.experiments.study import _start_setting

    study = STUDIES["one_vs_group"]
    setting, cfg = setting_configs(study, tmp_path, quick=False)[0]
    run_dir = tmp_path / setting.name
    run_dir.mkdir()
    (run_dir / "eval_before.json").write_text(json.dumps({"success_rate": 0.5, "key": "another policy"}))
    (run_dir / "metrics.jsonl").write_text("{}\n")
    _start_setting(cfg, run_dir, None, log=lambda m: None, head="")
    assert run_dir.is_dir() and list(run_dir.iterdir()) == []
