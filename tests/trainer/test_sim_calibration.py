"""The simulator calibrated on run folders: what is read from a folder, that the fit recovers known
numbers, and ``agentenv simulate --from-run``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from agentenv.errors import ConfigError
from agentenv.trainer.experiments.sim_calibration import (
    RunMeasurement,
    calibrate,
    compare_runs,
    format_comparison,
    measure_run,
)
from agentenv.trainer.experiments.simulator import EpisodeSample, SimConfig, main, simulate


def write_run(root: Path, name: str, *, mode: str = "async", policy: str = "pace", drift_mode: str = "token_share",
              latency: tuple[float, float] = (2.0, 1.0)) -> Path:
    """A run folder as the trainer writes it: two batches of B = 2, the second without a step."""
    d = root / name
    d.mkdir()
    cfg = {"env": {"step_latency": {"median_s": latency[0], "sigma": latency[1]}},
           "run": {"mode": mode, "batch_size": 2, "concurrency": 4, "max_pool_size": 6},
           "staleness": {"policy": policy, "max_lag": 4.0, "gamma": 4.0, "beta": 0.9, "target_occupancy": None,
                         "drift_mode": drift_mode}}
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    rows = [{"update": 1, "learner/version": 1.0, "busy/wall_s": 30.0, "busy/learner_s": 10.0, "time/wait_s": 19.0,
             "learner/update_seconds": 8.0},
            {"update": 1, "learner/version": 1.0, "busy/wall_s": 36.0, "busy/learner_s": 10.5, "time/wait_s": 5.5,
             "learner/update_seconds": 0.0}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    consumed = [  # (policy tokens, turns, tokens, gs, ws, start, completion)
        (60, 2, 360, 0.0, 0, 100.0, 110.0), (70, 2, 380, 0.5, 1, 101.0, 115.0),
        (50, 1, 330, 0.0, 0, 102.0, 108.0), (80, 2, 390, 1.0, 0, 103.0, 123.0)]
    (d / "staleness.jsonl").write_text("".join(json.dumps(
        {"policy_tokens": p, "turns": t, "tokens": n, "gs": gs, "ws": ws, "start_time": a, "completion_time": b})
        + "\n" for p, t, n, gs, ws, a, b in consumed))
    (d / "decisions.jsonl").write_text("".join(json.dumps({"rejected_count": k}) + "\n" for k in (0, 1, 0)))
    return d


def test_measure_run_reads_the_folder(tmp_path):
    m = measure_run(write_run(tmp_path, "pace_run"))
    assert (m.name, m.mode, m.policy) == ("pace_run", "async", "pace_share")  # token-share drift
    assert (m.batch_size, m.concurrency, m.max_pool_size) == (2, 4, 6)
    assert m.tool_latency_mean_s == pytest.approx(2.0 * math.exp(0.5)) and m.tool_latency_sigma == 1.0
    assert m.prompt_tokens == 305  # median of 300, 310, 280, 310 environment tokens
    assert list(m.episodes.policy_tokens) == [60, 70, 50, 80] and list(m.episodes.turns) == [2, 2, 1, 2]
    assert (m.batches, m.steps, m.wall_s, m.learner_s, m.step_s) == (2, 1, 36.0, 10.5, 8.0)
    assert m.step_overhead_s == pytest.approx(36.0 - 24.5 - 10.5)  # neither waiting nor learning
    assert m.updates_per_hour == pytest.approx(100.0) and m.learner_s_per_step == 10.5 and m.no_step_share == 0.5
    assert m.gs_mean == pytest.approx(0.375) and m.ws_mean == pytest.approx(0.25)
    assert m.rejection_rate == pytest.approx(1 / 5) and m.episode_s_mean == pytest.approx(12.5)  # 10, 14, 6, 20 s
    assert measure_run(write_run(tmp_path, "s", mode="sync", policy="none")).policy == "sync"
    assert measure_run(write_run(tmp_path, "p", drift_mode="scoring")).policy == "pace"
    assert measure_run(write_run(tmp_path, "z", latency=(0.0, 0.0))).tool_latency_mean_s == 0.0


def test_measure_run_reads_the_split_per_turn_where_recorded(tmp_path):
    d = write_run(tmp_path, "r")
    lines = [json.loads(x) for x in (d / "staleness.jsonl").read_text().splitlines()]
    for rec, split in zip(lines, ([50, 10], [60, 10], [50], [70, 10]), strict=True):
        rec["turn_policy_tokens"] = split
    (d / "staleness.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    m = measure_run(d)
    assert m.episodes.turn_tokens == ((50, 10), (60, 10), (50,), (70, 10))
    assert list(m.episodes.turns) == [2, 2, 1, 2]


def test_measure_run_errors_name_what_is_missing(tmp_path):
    d = write_run(tmp_path, "r")
    (d / "decisions.jsonl").unlink()
    with pytest.raises(ConfigError, match="decisions.jsonl"):
        measure_run(d)
    old = write_run(tmp_path, "old")
    (old / "staleness.jsonl").write_text(json.dumps({"policy_tokens": 5, "turns": 1, "gs": 0, "ws": 0}) + "\n")
    with pytest.raises(ConfigError, match="start and completion times"):
        measure_run(old)


SAMPLE = EpisodeSample(np.array([50, 60, 70, 80, 120]), np.array([2, 2, 2, 2, 2]))
TRUE = dict(decode_base_s=0.054, decode_per_seq_s=0.0034, train_step_s=20.0, train_slows_decode=1.6,
            decode_slows_train=1.8)


def simulated_run(name: str, policy: str, seed: int, copy_s: float = 0.0) -> RunMeasurement:
    """What a run folder would say about a simulated run with the known numbers :data:`TRUE` (and a
    window of ``copy_s`` seconds after each step in which the engine samples the old weights)."""
    cfg = SimConfig(policy=policy, batch_size=16, concurrency=16, num_trajectories=10**9, max_batches=30, seed=seed,
                    tool_latency_mean_s=3.3, tool_latency_sigma=1.0, max_pool_size=32, weight_sync_s=0.0,
                    weight_copy_s=copy_s, **TRUE)
    r = simulate(cfg, episodes=SAMPLE)
    return RunMeasurement(
        name=name, mode="sync" if policy == "sync" else "async", policy=policy, batch_size=16, concurrency=16,
        max_pool_size=32, max_lag=4.0, gamma=4.0, beta=0.9, target_occupancy=None, tool_latency_mean_s=3.3,
        tool_latency_sigma=1.0, prompt_tokens=300, episodes=SAMPLE, batches=r.batches, steps=r.updates,
        wall_s=r.sim_time_s, learner_s=r.trainer_busy * r.sim_time_s,
        step_s=TRUE["train_step_s"] * r.updates if copy_s and policy == "sync" else 0.0, overhead_s=0.0,
        gs_mean=float(r.gs.mean()), ws_mean=float(r.ws.mean()), rejected=r.rejected, consumed=r.consumed,
        episode_s_mean=float(r.episode_s.mean()))


def test_calibration_recovers_known_numbers_and_predicts_another_policy():
    sync, none, pace = (simulated_run(n, p, s) for n, p, s in (("sync", "sync", 100), ("none", "none", 101),
                                                                ("pace", "pace_share", 102)))
    cal = calibrate(sync, none, seeds=4)
    assert cal.decode_base_s == pytest.approx(TRUE["decode_base_s"], rel=0.05)
    assert cal.decode_base_s / cal.decode_per_seq_s == pytest.approx(0.108 / 0.0068)  # the shape is kept
    assert cal.train_step_s == pytest.approx(TRUE["train_step_s"]) and cal.weight_copy_s == 0.0
    assert cal.train_slows_decode == pytest.approx(TRUE["train_slows_decode"], rel=0.1)
    assert cal.decode_slows_train == pytest.approx(TRUE["decode_slows_train"], rel=0.1)
    (row,) = compare_runs([pace], cal, seeds=4)
    assert not row.fitted
    for figure in ("updates_per_hour", "ws_mean", "rejection_rate", "episode_s_mean"):
        assert abs(row.relative_error(figure)) < 0.05, figure
    table = format_comparison([row])
    assert "| pace | pace_share | predicted |" in table and len(table.splitlines()) == 3


def test_calibration_finds_the_window_of_old_weights():
    # 20 s of step, then 3 s of learner time in which the engine still samples the old weights: the
    # asynchronous run's generation staleness puts the window at the learner's 3 s after the step.
    sync, none = simulated_run("sync", "sync", 100, copy_s=3.0), simulated_run("none", "none", 101, copy_s=3.0)
    cal = calibrate(sync, none, seeds=2, rounds=1)
    assert cal.weight_copy_s == pytest.approx(3.0, abs=0.5)
    assert cal.train_step_s + cal.weight_copy_s == pytest.approx(23.0, rel=1e-3)


def test_calibrate_needs_one_sync_and_one_async_run():
    sync = simulated_run("sync", "sync", 1)
    with pytest.raises(ConfigError):
        calibrate(sync, sync)


def test_from_run_cli(tmp_path, capsys):
    runs = [write_run(tmp_path, "sync", mode="sync", policy="none"), write_run(tmp_path, "pace")]
    out = tmp_path / "out"
    assert main(["--from-run", *map(str, runs), "--seeds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| sync | sync | fit |" in printed and "| pace | pace_share | fit |" in printed
    saved = json.loads((out / "calibration.json").read_text())
    assert saved["calibration"]["fitted_on"] == ["sync", "pace"] and len(saved["runs"]) == 2
    assert (out / "comparison.md").read_text().strip() == printed.strip()
    assert main(["--from-run", str(runs[1])]) == 2  # nothing synchronous to fit on
    assert "one synchronous and one asynchronous" in capsys.readouterr().err
    assert main(["--from-run", *map(str, runs), "--fit", "nope"]) == 2
    assert main(["--from-run", str(tmp_path / "missing")]) == 2
