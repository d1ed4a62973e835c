"""`agentenv compare`'s table rows, computed from a hand-written run folder."""

from __future__ import annotations

import json

from agentenv.trainer.experiments.compare import markdown_table, summarize, with_ratio_to_sync


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_row_from_a_run_folder(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"updates": 2, "train_s": 41.26, "wall_clock_s": 90.0,
                                                       "overlap/bound": 2.46154, "overlap/achieved": 1.77778}))
    _jsonl(tmp_path / "metrics.jsonl", [
        {"update": 1, "reward/mean": 0.25, "pool/rejected": 3, "engine/busy_share": 0.5},
        {"update": 2, "reward/mean": 0.75, "pool/rejected": 1, "engine/busy_share": 0.8125},
    ])
    _jsonl(tmp_path / "staleness.jsonl", [{"gs": g, "ws": w} for g, w in [(0, 1), (1, 1), (2, 0), (1, 2)]])
    row = summarize("async-pace", tmp_path)
    assert row == {
        "setting": "async-pace", "updates": 2, "train_s": 41.3, "reward_mean": 0.5, "reward_last5": 0.5,
        "gs_mean": 1.0, "ws_mean": 1.0,
        "rejection_rate": 0.5,  # 4 rejected, 4 consumed
        "engine_busy_share": 0.812,  # the last row's cumulative share
        "overlap_bound": 2.462, "overlap_achieved": 1.778,
    }
    table = markdown_table([row])
    assert table.splitlines()[0].startswith("| setting | updates | train_s |")
    assert table.splitlines()[2].startswith("| async-pace | 2 | 41.3 |")


def test_time_is_compared_with_the_sync_baseline():
    rows = [{"setting": "sync", "train_s": 80.0}, {"setting": "async-pace", "train_s": 60.0}]
    assert [r["time_vs_sync"] for r in with_ratio_to_sync(rows)] == [1.0, 0.75]
    assert with_ratio_to_sync(rows[1:])[0]["time_vs_sync"] is None  # no baseline run


def test_a_run_without_overlap_figures_has_none(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"updates": 1, "train_s": 5.0}))  # written before them
    _jsonl(tmp_path / "metrics.jsonl", [{"update": 1, "reward/mean": 1.0, "engine/busy_share": 0.5}])
    _jsonl(tmp_path / "staleness.jsonl", [{"gs": 0, "ws": 0}])
    row = summarize("sync", tmp_path)
    assert (row["overlap_bound"], row["overlap_achieved"]) == (None, None)


def test_compare_trains_each_setting_in_a_child_and_keeps_the_finished_rows_after_a_stop_or_an_error(
        tmp_path, monkeypatch, capsys):
    from agentenv.errors import AgentEnvError
    from agentenv.trainer.experiments import compare

    outcomes, seen = {}, []

    def fake_child(cfg, run_dir, *, resume, seconds, head, then):
        seen.append((head, cfg.staleness.policy, cfg.run.updates, cfg.eval.problems, resume, then))
        if isinstance(outcomes[head], Exception):
            raise outcomes[head]
        return outcomes[head]

    monkeypatch.setattr(compare, "train_in_child", fake_child)
    def fake_row(name, run_dir):  # the n-th setting trained took 100 - 20 n seconds
        return {"setting": name, "train_s": 100.0 - 20 * len(seen)}

    monkeypatch.setattr(compare, "summarize", fake_row)

    outcomes.update({"sync": (True, False), "async-none": (True, True)})  # Ctrl-C after async-none had finished
    assert compare.main(["--updates", "3", "--out", str(tmp_path / "a")]) == 130
    assert seen == [("sync", "sync", 3, 0, False, "run it again with --overwrite (add --only sync "
                     "async-none async-max_lag async-pace to keep the settings that finished)"),
                    ("async-none", "none", 3, 0, False, "run it again with --overwrite (add --only "
                     "async-none async-max_lag async-pace to keep the settings that finished)")]
    rows = json.loads((tmp_path / "a" / "compare.json").read_text())
    assert [(r["setting"], r["time_vs_sync"]) for r in rows] == [("sync", 1.0), ("async-none", 0.75)]  # 60 s / 80 s
    assert "stopped after async-none" in capsys.readouterr().err

    seen.clear()
    outcomes.update({"async-max_lag": (False, True)})  # Ctrl-C during the run: no row for it
    assert compare.main(["--only", "sync", "async-max_lag", "--out", str(tmp_path / "b")]) == 130
    assert [r["setting"] for r in json.loads((tmp_path / "b" / "compare.json").read_text())] == ["sync"]
    assert "stopped during async-max_lag" in capsys.readouterr().err

    seen.clear()
    outcomes.update({"async-none": AgentEnvError("async-none: the run's process was killed by SIGKILL")})
    assert compare.main(["--out", str(tmp_path / "c")]) == 2  # the OOM killer: reported, the table kept
    assert [s[0] for s in seen] == ["sync", "async-none"]
    assert [r["setting"] for r in json.loads((tmp_path / "c" / "compare.json").read_text())] == ["sync"]
    assert "agentenv compare: async-none: the run's process was killed by SIGKILL" in capsys.readouterr().err


def test_overrides_may_follow_the_list_of_settings(tmp_path, monkeypatch, capsys):
    from agentenv.trainer.experiments import compare

    seen = []
    monkeypatch.setattr(compare, "train_in_child", lambda cfg, run_dir, **_: seen.append(
        (cfg.staleness.policy, cfg.run.updates, cfg.eval.problems)) or (True, False))
    monkeypatch.setattr(compare, "summarize", lambda name, run_dir: {"setting": name, "train_s": 1.0})
    # as in BENCHMARKS' command: an override after --only's settings is not taken for one of them
    argv = ["--updates", "12", "--only", "sync", "async-pace", "eval.problems=3", "--out", str(tmp_path / "c")]
    assert compare.main(argv) == 0
    assert seen == [("sync", 12, 3), ("pace", 12, 3)]
    # an override whose key is no identifier reaches the config's error, a stray word the parser's: nothing is dropped
    assert compare.main(["--only", "sync", "run.some-key=1", "--out", str(tmp_path / "d")]) == 2
    assert "unknown field(s) ['some-key']" in capsys.readouterr().err
    assert compare.main(["--only", "sync", "--out", str(tmp_path / "e"), "stray"]) == 2
    err = capsys.readouterr().err
    assert "Unrecognized options" in err and "stray" in err
    assert len(seen) == 2


def test_compare_never_writes_among_or_deletes_user_files(tmp_path, capsys):
    from agentenv.trainer.experiments.compare import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter one")
    assert main(["--out", str(mine), "--updates", "1", "--overwrite"]) == 2
    assert "holds files that are not a comparison's (thesis.tex)" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"]
    # a folder named like a setting, holding the user's files, is not a run folder: --overwrite keeps it
    (tmp_path / "out" / "sync").mkdir(parents=True)
    (tmp_path / "out" / "sync" / "notes.txt").write_text("mine")
    assert main(["--out", str(tmp_path / "out"), "--updates", "1", "--overwrite", "--only", "sync"]) == 2
    assert "not an agentenv training run folder" in capsys.readouterr().err
    assert (tmp_path / "out" / "sync" / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["sync"]
