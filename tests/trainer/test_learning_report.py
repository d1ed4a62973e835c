"""The seeds' report: collapse checks by hand, aggregation over runs, and the seeds-then-tasks interval."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from agentenv.errors import DataError
from agentenv.trainer.experiments.learning_report import aggregate, entropy_ratio, main, read_run, reward_holds
from agentenv.trainer.experiments.significance import seed_task_bootstrap


def test_reward_holds_compares_the_last_quarter_with_the_second():
    # 12 updates: quarters of 3; second quarter = updates 4-6, last = 10-12
    assert reward_holds([.5, .4, .4, .5, .7, .6, .7, .8, .3, .6, .6, .6])  # 0.6 >= 0.6
    # the collapse the default once showed: .56 .38 .44 .50 .69 .56 .75 .81 .31 .31 .38 .44
    assert not reward_holds([.56, .38, .44, .50, .69, .56, .75, .81, .31, .31, .38, .44])
    assert reward_holds([0, 0, 0, 0, 0])  # n = 5: quarters of 2, updates 3-4 against 4-5
    with pytest.raises(DataError, match="at least 4 batches"):
        reward_holds([1, 1, 1])


def test_entropy_ratio_against_the_running_minimum_from_update_three():
    assert entropy_ratio([0.3, 0.1, 0.2, 0.05, 0.1]) == pytest.approx(2.0)  # update 5: 0.1 / 0.05
    assert entropy_ratio([0.9, 0.1]) == 1.0  # updates 1-2 are not judged
    assert entropy_ratio([0.3, 0.029, 0.05, 0.36]) == pytest.approx(0.36 / 0.029)  # the twelvefold rise
    assert entropy_ratio([0.2, math.nan, 0.1, 0.25]) == pytest.approx(2.5)


def _run(folder, seed, rewards, entropies, before, after):
    folder.mkdir()
    rows = [{"update": i + 1, "reward/mean": r, "learner/behaviour_entropy": h, "learner/stepped": 1.0}
            for i, (r, h) in enumerate(zip(rewards, entropies, strict=True))]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, outcomes in (("before", before), ("after", after)):
        (folder / f"eval_{name}.json").write_text(json.dumps({"outcomes": outcomes,
                                                               "success_rate": sum(outcomes) / len(outcomes)}))
    (folder / "config.yaml").write_text(yaml.safe_dump({"run": {"seed": seed}}))
    (folder / "summary.json").write_text(json.dumps({"peak_rss_gb": 4.5, "wall_clock_s": 600.0}))
    return folder


def test_aggregate_over_seeds(tmp_path, capsys):
    before = [1, 0, 0, 0] * 5  # 0.25 on 20 tasks
    runs = [
        _run(tmp_path / "s0", 0, [.4, .5, .6, .7], [.2, .1, .1, .1], before, [1, 1, 0, 0] * 5),  # 0.50
        _run(tmp_path / "s1", 1, [.4, .5, .6, .7], [.2, .1, .1, .1], before, [1, 1, 1, 0] * 5),  # 0.75
        _run(tmp_path / "s2", 2, [.4, .8, .3, .2], [.2, .1, .05, .2], before, [1, 0, 0, 0] * 5),  # 0.25, collapsed
    ]
    reports = [read_run(r) for r in runs]
    assert [r.seed for r in reports] == [0, 1, 2] and [r.after for r in reports] == [0.5, 0.75, 0.25]
    assert [r.collapsed for r in reports] == [False, False, True]
    assert reports[2].entropy_ratio == pytest.approx(4.0)  # 0.2 / 0.05 at update 4
    agg = aggregate(reports)
    assert agg["after_mean"] == pytest.approx(0.5) and agg["after_sd"] == pytest.approx(0.25)
    assert (agg["after_min"], agg["after_max"]) == (0.25, 0.75)
    assert agg["change_mean"] == pytest.approx(0.25) and agg["change_min"] == pytest.approx(0.0)
    assert agg["change_low"] <= 0.25 <= agg["change_high"] and not agg["every_run_gains"]
    assert agg["collapsed_runs"] == ["s2"]
    out = tmp_path / "report"
    assert main([str(r) for r in runs] + ["--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| s0 | 0 | 4 | 0.250 | 0.500 | +25.0" in text and "collapsed: s2" in text
    saved = json.loads((out / "report.json").read_text())
    assert saved["aggregate"]["after_sd"] == pytest.approx(0.25)
    assert (out / "curves.png").stat().st_size > 5000


def test_the_exact_policy_entropy_is_read_where_the_run_logs_it(tmp_path):
    before, after = [0, 1] * 5, [1, 1] * 5
    run = _run(tmp_path / "s0", 0, [.4, .5, .6, .7], [.2, .02, .2, .2], before, after)  # -log mu: ratio 10
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, h in zip(rows, [.30, .20, None, .25], strict=True):  # null: a batch that ran no forward pass
        row["learner/policy_entropy"] = h
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = read_run(run)
    assert report.entropy_key == "learner/policy_entropy"
    assert report.entropy_ratio == pytest.approx(1.25) and not report.collapsed  # 0.25 / 0.20 at update 4
    assert math.isnan(report.entropies[2])
    older = read_run(_run(tmp_path / "s1", 1, [.4, .5, .6, .7], [.2, .02, .2, .2], before, after))
    assert older.entropy_key == "learner/behaviour_entropy" and older.entropy_ratio == pytest.approx(10.0)
    for row, h in zip(rows, [.10, .09, .11, .10], strict=True):  # the fixed probe, where logged, comes first
        row["probe/policy_entropy"] = h
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    probed = read_run(run)
    assert probed.entropy_key == "probe/policy_entropy"
    assert probed.entropy_ratio == pytest.approx(0.11 / 0.09)
    assert probed.entropies == pytest.approx([.10, .09, .11, .10])


def test_batches_without_a_step_count_in_the_reward_check(tmp_path):
    """All-correct batches take no step (every advantage 0); leaving them out would read a climb as a fall."""
    before, after = [0, 1] * 5, [1, 1] * 5
    # 8 stepped updates; batches 9 and 10 (all correct, no step) come at the end
    run = _run(tmp_path / "s0", 0, [.2, .3, .7, .8, .7, .6, .6, .6], [.1] * 8, before, after)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows += [{"update": 8, "reward/mean": 1.0, "learner/stepped": 0.0}] * 2
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    report = read_run(run)
    assert report.updates == 8 and len(report.entropies) == 8  # updates are the stepped batches
    assert report.rewards == [.2, .3, .7, .8, .7, .6, .6, .6, 1.0, 1.0]
    # quarters of 3 batches: the second (.8, .7, .6) against the last (.6, 1, 1): holds; the stepped
    # updates alone (quarters of 2: .7, .8 against .6, .6) would read a fall
    assert report.reward_holds and not reward_holds([.2, .3, .7, .8, .7, .6, .6, .6])


def test_a_folder_that_is_not_a_finished_run_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_seed_task_bootstrap():
    same = [[0, 1, 0, 1]] * 3
    plus_one = [[1, 1, 1, 1]] * 3
    iv = seed_task_bootstrap(same, plus_one, resamples=200)
    assert (iv.delta, iv.tasks, iv.method) == (0.5, 4, "seed_task_bootstrap")
    assert 0.0 <= iv.low <= 0.5 <= iv.high <= 1.0
    constant = seed_task_bootstrap([[0, 0]] * 2, [[1, 1]] * 2, resamples=100)
    assert (constant.low, constant.high) == (1.0, 1.0)  # every run gains 1 on every task: no spread
    # seeds that disagree widen the interval beyond the one-seed task noise
    spread = seed_task_bootstrap([[0] * 50] * 4, [[1] * 50, [0] * 50, [1] * 50, [0] * 50], resamples=2000)
    assert spread.delta == 0.5 and spread.low < 0.2 and spread.high > 0.8
    with pytest.raises(DataError, match="same number of held-out tasks"):
        seed_task_bootstrap([[0, 1], [0]], [[1, 1], [1]])
