"""The simulated cluster: how the two layouts map onto the simulator, and the GPU-hours arithmetic."""

from __future__ import annotations

import json

import pytest

from agentenv.errors import ConfigError
from agentenv.trainer.experiments.simulated_scale import ClusterAssumptions, format_scale, main, simulate_scale

SMALL = ClusterAssumptions(gen_gpus=2, train_gpus=2, batch_size=8, concurrency=32, max_pool_size=16,
                           tokens_mean=200.0, tokens_max=1000, train_step_s=4.0, weight_sync_s=1.0, updates=6)


def test_layouts():
    a = ClusterAssumptions()
    sync, pace = a.sim_config("sync", 0), a.sim_config("pace", 0)
    # colocated: every GPU decodes (16 replicas), the step on 16 GPUs takes half the 8-GPU time, B in flight
    assert sync.decode_per_seq_s == pytest.approx(0.0002 / 16) and sync.train_step_s == pytest.approx(6.0)
    assert sync.concurrency == 128 and sync.max_pool_size is None
    # disaggregated: 8 replicas decode, 8 GPUs train
    assert pace.decode_per_seq_s == pytest.approx(0.0002 / 8) and pace.train_step_s == 12.0
    assert pace.concurrency == 512 and pace.max_pool_size == 256 and pace.max_batches == 200


def test_gpu_hours_per_update():
    rows, raw = simulate_scale(SMALL, seeds=2, error_band=0.1, policies=("sync", "none", "pace"))
    by = {r.policy: r for r in rows}
    for p, r in by.items():
        per_update = sum(x.sim_time_s / x.updates for x in raw[p]) / 2
        assert r.seconds_per_update == pytest.approx(per_update)
        assert r.gpu_hours_per_update == pytest.approx(4 * per_update / 3600)
        assert (r.gpu_hours_low, r.gpu_hours_high) == pytest.approx((0.9 * r.gpu_hours_per_update,
                                                                     1.1 * r.gpu_hours_per_update))
        assert r.relative_to_sync == pytest.approx(r.gpu_hours_per_update / by["sync"].gpu_hours_per_update)
    assert by["sync"].gs_mean == 0 and by["sync"].ws_mean == 0 and by["none"].rejection_rate == 0
    # the learner's 4 s step and 1 s sync bound the asynchronous layout from below
    assert by["none"].seconds_per_update >= 5.0
    table = format_scale(rows, SMALL, 0.1)
    assert table.startswith("Assumptions: gen_gpus = 2") and "| pace |" in table


def test_bad_values():
    with pytest.raises(ConfigError):
        ClusterAssumptions(gen_gpus=0)
    with pytest.raises(ConfigError):
        simulate_scale(SMALL, error_band=1.0)
    with pytest.raises(ConfigError):
        simulate_scale(SMALL, policies=("none", "pace"))


def test_cli_writes_the_figures(tmp_path, capsys):
    args = ["--seeds", "1", "--cluster.updates", "4", "--cluster.batch-size", "8", "--cluster.concurrency", "32",
            "--cluster.max-pool-size", "16", "--cluster.tokens-mean", "200", "--cluster.tokens-max", "1000",
            "--out", str(tmp_path)]
    assert main(args) == 0
    saved = json.loads((tmp_path / "scale.json").read_text())
    assert [p["policy"] for p in saved["policies"]] == ["sync", "none", "max_lag", "pace", "pace_share"]
    assert (tmp_path / "staleness.png").stat().st_size > 0 and "| sync |" in capsys.readouterr().out
    assert main(["--error-band", "2"]) == 2
