"""Studies over seeds: how many seeds, the paired differences, the verdicts, the runner's order and resume."""

from __future__ import annotations

import json
import math

import pytest

from agentenv.errors import ConfigError, DataError, RunFolderError
from agentenv.trainer.experiments import study, study_report
from agentenv.trainer.experiments.seeded_study import (
    CONTRADICTED,
    REPRODUCED,
    UNDECIDED,
    compare,
    decide,
    plan_seeds,
    read_results,
    run_seeded_study,
    seeded_markdown,
    seeded_summary,
)
from agentenv.trainer.experiments.significance import detectable_effect, seed_bootstrap, seeds_for_effect
from agentenv.trainer.experiments.studies import STUDIES, Expectation

Z = 1.959963984540054 + 0.8416212335729143  # z_{0.975} + z_{0.8}


def test_seeds_for_an_effect_by_hand():
    # k = ceil(2 (z + z)^2 sd^2 / effect^2): sd 8.3 points, 10 points -> 2 * 7.849 * 0.6889 = 10.81 -> 11
    assert seeds_for_effect(0.083, 0.10) == 11 == math.ceil(2 * Z**2 * 0.083**2 / 0.10**2)
    assert seeds_for_effect(0.05, 0.10) == 4  # 3.92
    assert seeds_for_effect(0.10, 0.10) == 16  # 15.7: the "about 15 seeds" at the old default's spread
    assert seeds_for_effect(0.01, 0.10) == 2  # never fewer than two: one seed has no spread
    assert detectable_effect(0.083, 5) == pytest.approx(Z * 0.083 * math.sqrt(2 / 5))
    assert detectable_effect(0.083, 5) == pytest.approx(0.1471, abs=1e-4)
    for sd in (0.03, 0.083, 0.12):  # the seeds it asks for detect at least the effect
        for effect in (0.05, 0.1, 0.2):
            assert detectable_effect(sd, seeds_for_effect(sd, effect)) <= effect + 1e-12
    with pytest.raises(DataError):
        seeds_for_effect(0.0, 0.1)
    with pytest.raises(DataError):
        detectable_effect(0.1, 0)


def test_plan_seeds():
    assert plan_seeds("auto", effect=0.10) == 11  # SEED_SPREAD, the default's measured 8.3 points
    assert plan_seeds("auto", effect=0.10, sd=0.05) == 4
    assert plan_seeds("3", effect=0.10) == 3
    for bad in ("0", "-2", "many"):
        with pytest.raises(ConfigError, match="--seeds takes a count"):
            plan_seeds(bad, effect=0.10)


@pytest.mark.parametrize("direction, low, high, verdict", [
    ("higher", 0.01, 0.2, REPRODUCED), ("higher", -0.2, -0.01, CONTRADICTED), ("higher", -0.05, 0.2, UNDECIDED),
    ("lower", -0.2, -0.01, REPRODUCED), ("lower", 0.01, 0.2, CONTRADICTED), ("lower", -0.2, 0.0, UNDECIDED),
    # not lower than the reference by more than the margin (0.1)
    ("not_lower", -0.09, 0.05, REPRODUCED), ("not_lower", -0.3, -0.01, CONTRADICTED),
    ("not_lower", -0.15, 0.05, UNDECIDED), ("not_lower", -0.05, -0.01, REPRODUCED),
])
def test_the_decision_rule(direction, low, high, verdict):
    assert decide(direction, low, high, 0.1) == verdict


def test_the_decision_rule_refuses_nonsense():
    with pytest.raises(DataError):
        decide("sideways", 0.0, 1.0, 0.1)
    with pytest.raises(DataError):
        decide("higher", 1.0, 0.0, 0.1)


def test_seed_bootstrap():
    assert seed_bootstrap([0.2, 0.2, 0.2]) == pytest.approx((0.2, 0.2))
    assert seed_bootstrap([0.3]) == pytest.approx((0.3, 0.3))
    low, high = seed_bootstrap([-1.0, 1.0, 0.0, 2.0])
    assert -1.0 <= low < 0.5 < high <= 2.0  # the mean 0.5 inside, within the values' range
    with pytest.raises(DataError):
        seed_bootstrap([])
    with pytest.raises(DataError):
        seed_bootstrap([float("nan")])


def _record(setting, seed, after, *, ids=None, before=None, **row):
    ids = ids or [f"t{i}" for i in range(len(after))]
    report = {"success_rate": sum(after) / len(after), "task_ids": ids, "outcomes": after}
    before = before or [0] * len(after)
    return {"setting": setting, "seed": seed, "row": {"setting": setting, **row},
            "after": report, "before": {"success_rate": sum(before) / len(before), "task_ids": ids,
                                        "outcomes": before}}


def test_compare_pairs_by_seed_and_task():
    e = Expectation("b", "a", "higher")
    records = {}
    for s in range(3):
        records["a", s] = _record("a", s, [1, 0, 0, 0])
        # the same tasks listed in another order: b solves every task, a only t0
        records["b", s] = _record("b", s, [1, 1, 1, 1], ids=["t3", "t2", "t1", "t0"])
    out = compare(e, records, effect=0.1, resamples=500)
    assert out["seeds"] == [0, 1, 2] and out["difference"] == pytest.approx(0.75)
    # per task the difference is 0 on t0 and 1 elsewhere: resampled tasks span [0, 1] around 0.75
    assert 0.0 <= out["ci95"][0] < 0.75 < out["ci95"][1] <= 1.0
    assert out["verdict"] == REPRODUCED
    assert compare(Expectation("b", "a", "lower"), records, effect=0.1, resamples=500)["verdict"] == CONTRADICTED


def test_compare_undecided_when_seeds_disagree_and_with_one_seed():
    records = {("a", 0): _record("a", 0, [0, 0, 0, 0]), ("b", 0): _record("b", 0, [1, 1, 1, 1]),
               ("a", 1): _record("a", 1, [1, 1, 1, 1]), ("b", 1): _record("b", 1, [0, 0, 0, 0])}
    out = compare(Expectation("b", "a", "higher"), records, effect=0.1, resamples=2000)
    assert out["difference"] == pytest.approx(0.0) and out["verdict"] == UNDECIDED
    assert out["ci95"][0] < 0 < out["ci95"][1]
    one = {k: v for k, v in records.items() if k[1] == 0}  # +1.0 on every task, but a single seed
    out = compare(Expectation("b", "a", "higher"), one, effect=0.1, resamples=500)
    assert out["ci95"] == [1.0, 1.0] and out["verdict"] == UNDECIDED


def test_compare_a_per_run_figure_and_missing_values():
    records = {("a", s): _record("a", s, [0, 1], tool_calls_after=1.0) for s in range(3)}
    records.update({("b", s): _record("b", s, [0, 1], tool_calls_after=0.6 - 0.1 * s) for s in range(3)})
    out = compare(Expectation("b", "a", "lower", "tool_calls_after"), records, effect=0.1, resamples=500)
    assert out["difference"] == pytest.approx(-0.5) and out["verdict"] == REPRODUCED
    assert -0.6 - 1e-9 <= out["ci95"][0] <= out["ci95"][1] <= -0.4 + 1e-9
    records["b", 2]["row"]["tool_calls_after"] = None  # a run that did not measure it counts no seed
    assert compare(Expectation("b", "a", "lower", "tool_calls_after"), records, effect=0.1)["seeds"] == [0, 1]
    assert compare(Expectation("c", "a", "lower"), records, effect=0.1)["difference"] is None


def test_compare_refuses_evaluations_of_other_tasks():
    records = {("a", 0): _record("a", 0, [0, 1]), ("b", 0): _record("b", 0, [0, 1], ids=["x", "y"])}
    with pytest.raises(DataError, match="not of the same tasks"):
        compare(Expectation("b", "a", "higher"), records, effect=0.1)


def test_the_summary_spread_by_hand():
    st = STUDIES["signed_feedback"]
    records = {}
    for s, (full, pos) in enumerate([(0.75, 0.5), (0.5, 0.25), (1.0, 0.5)]):
        records["full_baseline", s] = _record("full_baseline", s, [1] * int(4 * full) + [0] * (4 - int(4 * full)),
                                              gain=full, tool_calls_after=1.0)
        records["positive_only", s] = _record("positive_only", s, [1] * int(4 * pos) + [0] * (4 - int(4 * pos)),
                                              gain=pos, tool_calls_after=0.5)
    summary = seeded_summary(st, records, seeds=3, effect=0.1)
    full, pos = summary["settings"]
    assert full["seeds"] == [0, 1, 2] and full["after_mean"] == pytest.approx(0.75)
    assert full["after_sd"] == pytest.approx(0.25) and (full["after_min"], full["after_max"]) == (0.5, 1.0)
    assert pos["after_mean"] == pytest.approx(0.4167, abs=1e-4) and pos["figures"]["tool_calls_after"] == 0.5
    assert summary["detectable"] == pytest.approx(Z * 0.083 * math.sqrt(2 / 3), abs=1e-4)
    # positive_only's after: 0.5, 0.25, 0.5 (sd 0.1443); pooled with full_baseline's 0.25 over 2 + 2 df
    assert pos["after_sd"] == pytest.approx(0.1443, abs=1e-4)
    assert summary["measured_sd"] == pytest.approx(math.sqrt((0.25**2 + 0.1443**2) / 2), abs=1e-4)
    claims = {c["figure"]: c for c in summary["claims"]}
    assert claims["tool_calls_after"]["difference"] == pytest.approx(-0.5)
    assert claims["tool_calls_after"]["verdict"] == REPRODUCED
    md = seeded_markdown(st, summary, "a scale")
    assert "| full_baseline | 3 | 75.0 | 25.0 | 50.0-100.0 |" in md
    assert "`positive_only` lower than `full_baseline` | tool_calls_after | 3 | -0.5 [-0.5, -0.5] | reproduced |" in md


def test_every_study_states_expectations_between_its_own_settings():
    for st in STUDIES.values():
        names = {s.name for s in st.settings}
        assert st.expect, st.name
        for e in st.expect:
            assert {e.setting, e.reference} <= names and e.setting != e.reference
            assert e.figure in st.figures, (st.name, e.figure)
            assert e.direction != "not_lower" or e.figure == "success_after"  # its margin is in points


# -- the runner, with the training replaced by a fake that writes what a finished run writes ----------------
@pytest.fixture
def fake_training(monkeypatch):
    calls = []

    def run_setting(st, setting, cfg, run_dir, *, root, seconds, share, log, head):
        calls.append((setting.name, cfg.run.seed, run_dir))
        run_dir.mkdir(parents=True, exist_ok=True)
        good = 3 if setting.name == "full_baseline" else 1
        for label, outcomes in (("before", [0, 0, 0, 0]), ("after", [1] * good + [0] * (4 - good))):
            (run_dir / f"eval_{label}.json").write_text(json.dumps(
                {"success_rate": sum(outcomes) / 4, "task_ids": ["a", "b", "c", "d"], "outcomes": outcomes}))
        return True, False

    def study_row(st, setting, run_dir, reference=None):
        after = json.loads((run_dir / "eval_after.json").read_text())
        return {"setting": setting, "success_after": after["success_rate"], "gain": after["success_rate"],
                "tool_calls_after": 1.0 if setting == "full_baseline" else 0.25, "tool_calls": 0.9,
                "reward_last5": 0.5}

    monkeypatch.setattr(study, "run_setting", run_setting)
    monkeypatch.setattr(study_report, "study_row", study_row)
    return calls


def test_the_runner_goes_seed_by_seed_and_keeps_results_that_exist_elsewhere(tmp_path, fake_training):
    root, results = tmp_path / "study", tmp_path / "docs" / "signed_feedback"
    out = run_seeded_study("signed_feedback", root, seeds=2, effect=0.1, results=results, quick=True, log=print)
    assert [(name, seed) for name, seed, _ in fake_training] == [
        ("full_baseline", 0), ("positive_only", 0), ("full_baseline", 1), ("positive_only", 1)]
    assert fake_training[3][2] == root / "positive_only" / "seed1"
    assert sorted(read_results(results, STUDIES["signed_feedback"])) == [
        ("full_baseline", 0), ("full_baseline", 1), ("positive_only", 0), ("positive_only", 1)]
    by_figure = {c["figure"]: c for c in out["claims"]}
    assert by_figure["success_after"]["difference"] == pytest.approx(-0.5)
    assert by_figure["tool_calls_after"]["verdict"] == REPRODUCED and not out["interrupted"]
    assert "| positive_only | 2 | 25.0 | 0.0 | 25.0-25.0 | +25.0 |" in (root / "study.md").read_text()
    # another machine: the run folders are gone, the committed results are not; two more seeds run
    elsewhere = tmp_path / "elsewhere"
    fake_training.clear()
    run_seeded_study("signed_feedback", elsewhere, seeds=4, effect=0.1, results=results, quick=True, log=print)
    assert [(name, seed) for name, seed, _ in fake_training] == [
        ("full_baseline", 2), ("positive_only", 2), ("full_baseline", 3), ("positive_only", 3)]
    held = json.loads((elsewhere / "study.json").read_text())
    assert held["seeds"] == 4 and [s["seeds"] for s in held["settings"]] == [[0, 1, 2, 3]] * 2


def test_a_seeded_study_folder_and_a_single_seed_one_do_not_mix(tmp_path, fake_training):
    root = tmp_path / "study"
    run_seeded_study("signed_feedback", root, seeds=1, effect=0.1, quick=True, log=print)
    with pytest.raises(RunFolderError, match="with --seeds"):
        study.check_folder(root, STUDIES["signed_feedback"], quick=True, resume=True)
    with pytest.raises(RunFolderError, match="pass --resume"):
        run_seeded_study("signed_feedback", root, seeds=2, effect=0.1, quick=True, log=print)
    run_seeded_study("signed_feedback", root, seeds=2, effect=0.1, quick=True, resume=True, log=print)
    assert [seed for _, seed, _ in fake_training] == [0, 0, 1, 1]


def test_bad_study_arguments(tmp_path):
    with pytest.raises(ConfigError, match="--effect"):
        run_seeded_study("signed_feedback", tmp_path / "s", seeds=2, effect=10.0, quick=True)
    assert study.main(["signed_feedback", "--results", str(tmp_path / "r")]) == 2


def test_the_command_line_runs_a_study_over_seeds(tmp_path, fake_training, capsys):
    assert study.main(["signed_feedback", "--quick", "--seeds", "2", "--effect", "15",
                       "--run-dir", str(tmp_path / "s")]) == 0
    held = json.loads((tmp_path / "s" / "study.json").read_text())
    assert (held["seeds"], held["effect"]) == (2, 0.15) and len(fake_training) == 4
    assert "# Study signed_feedback, over seeds" in capsys.readouterr().out
    assert study.main(["signed_feedback", "--quick", "--seeds", "none", "--run-dir", str(tmp_path / "t")]) == 2
