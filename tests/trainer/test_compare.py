"""`agentenv compare`'s table rows, computed from a hand-written run folder."""

from __future__ import annotations

import json

from agentenv.trainer.compare import markdown_table, summarize, with_ratio_to_sync


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
