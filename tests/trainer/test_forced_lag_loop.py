"""``staleness.forced_lag`` in the real training loop: the engine gets each update's weights k versions late.

``trainer.train.train()`` runs for real (collector, pool, next_batch, the single-process Learner on a random
1-layer Llama, staleness.jsonl) with the scripted engine of ``tests.fakes``, whose segments carry the
version of the weights it serves. Every batch steps (``optim.step_on_zero_gradient``), so batch j is
consumed at learner version j, and the versions can be computed by hand: with k = 2 the engine
serves max(0, v - 2) while the learner is at v, gets versions 1..4 after updates 3..6, and every
trajectory consumed at v has each token's lag >= min(2, v), so GS + WS >= min(2, v).
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from agentenv.engines.supervised import rebuild_from_learner
from agentenv.rollout.pool import LENGTH_BINS
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from agentenv.trainer.setup import LoopParts
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine, recording_learner

from .test_loop_failures import OVERRIDES, tiny_lm

pytestmark = pytest.mark.timeout(120)

K = 2


class RecordingEngine(ScriptedEngine):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.updates: list[tuple[int, dict]] = []

    async def update_weights(self, weights, version):
        self.updates.append((version, weights))
        await super().update_weights(weights, version)


def test_the_engine_lags_k_versions_and_the_recorded_staleness_shows_it(tmp_path):
    batches: list[list] = []
    engines: list[RecordingEngine] = []
    snapshots: dict[int, dict] = {}  # the learner's weights at each version, as it handed them out
    build_learner = recording_learner(batches)

    def learner_recording_snapshots(cfg, model):
        learner = build_learner(cfg, model)
        real = learner.weights_for_engine

        def weights_for_engine(*a, **kw):
            sd = real(*a, **kw)
            snapshots.setdefault(learner.version, sd)
            return sd

        learner.weights_for_engine = weights_for_engine
        return learner

    def engine(cfg, model, tok):
        engines.append(RecordingEngine(["done", "no", "no"], max_context_tokens=64))
        return engines[-1]

    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()), build_engine=engine,
                      env_factory=lambda cfg, *_: CountdownEnv, build_learner=learner_recording_snapshots)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "6",
                                "staleness.policy=none", f"staleness.forced_lag={K}",
                                "optim.step_on_zero_gradient=true"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 90))
    assert summary["updates"] == 6 and len(batches) == 6

    # the engine got versions 1..4 (after updates 3..6), each exactly the learner's weights of that version
    (eng,) = engines
    assert [v for v, _ in eng.updates] == [1, 2, 3, 4]
    for v, sd in eng.updates:
        assert sd.keys() == snapshots[v].keys() and all(torch.equal(sd[k], snapshots[v][k]) for k in sd)
    assert not all(torch.equal(snapshots[1][k], snapshots[4][k]) for k in snapshots[1])  # they did change

    # batch j, consumed at version j, holds only tokens of versions <= max(0, j - k)
    for j, batch in enumerate(batches):
        assert max(s.version for t in batch for s in t.segments) <= max(0, j - K)
    records = [json.loads(line) for line in (run_dir / "staleness.jsonl").read_text().splitlines()]
    assert [r["version"] for r in records] == [j for j in range(6) for _ in range(4)]
    for r in records:
        assert r["gs"] + r["ws"] >= min(K, r["version"]) - 1e-9
    late = [r["gs"] + r["ws"] for r in records if r["version"] >= K]
    assert len(late) == 16 and min(late) >= K
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(row["staleness/gs_mean"] + row["staleness/ws_mean"] >= K for row in rows[K:])
    # policy none rejects nothing: every length bin that a consumed trajectory fell in has rate 0, the others none
    for row in rows:
        assert [row[f"pool/rejected_by_length/{b}"] for b in LENGTH_BINS] == [0, 0, 0]
        rates = [row[f"pool/rejected_rate_by_length/{b}"] for b in LENGTH_BINS]
        assert set(rates) <= {0.0, None} and 0.0 in rates


@pytest.mark.parametrize("gate, delta, share", [("sequence", "100.0", 1.0), ("token", "100.0", 1.0),
                                                ("token", "0.0", 0.0), ("none", "0.0", 1.0)])
def test_every_gate_trains_under_the_lag_and_logs_its_admission(tmp_path, gate, delta, share):
    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()),
                      build_engine=lambda cfg, model, tok: ScriptedEngine(["done", "no"]),
                      env_factory=lambda cfg, *_: CountdownEnv,
                      sync_check=lambda cfg: None)  # a scripted engine samples no policy
    overrides = [o for o in OVERRIDES if not o.startswith("objective.delta")]
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *overrides, "--updates", "3",
                                "staleness.policy=none", "staleness.forced_lag=1", f"objective.gate={gate}",
                                f"objective.delta={delta}", "optim.step_on_zero_gradient=true"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 90))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert summary["updates"] == 3 and len(rows) == 3
    # the scripted log-probs (-0.5 per token) are far from the random model's: D > 0, whatever the gate
    assert all(r["learner/mean_d"] > 0.1 for r in rows)
    assert [r["learner/admitted_token_fraction"] for r in rows] == [share] * 3
    assert [r["learner/admitted_fraction"] for r in rows] == [share] * 3
    assert [r["learner/kept_tokens"] > 0 for r in rows] == [share > 0] * 3


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_engine_rebuilt_under_the_lag_serves_the_lagged_weights(tmp_path, monkeypatch):
    from agentenv.faults import FAULTS, reset_fault_points

    batches: list[list] = []
    rebuilds: list[tuple[int, int]] = []  # (version the rebuilt engine got, learner version then)

    async def rebuild(dead, source, build):
        # under the learner lock: no update runs, so the learner's version is the number of batches so far
        rebuilds.append((source.version, len(batches)))
        return await rebuild_from_learner(dead, source, build)

    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()),  # the real TransformersEngine
                      env_factory=lambda cfg, *_: CountdownEnv, build_learner=recording_learner(batches),
                      rebuild_engine=rebuild)
    reset_fault_points()
    # its decode thread dies mid-run, once it serves version 2: the learner is then at K + 2 (or K + 3)
    monkeypatch.setenv("AGENTENV_FAULT", "engine.decode:v2")
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, "--updates", "10",
                                "staleness.policy=none", f"staleness.forced_lag={K}",
                                "optim.step_on_zero_gradient=true", "model.max_batch_size=4"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    try:
        summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 100))
    finally:
        reset_fault_points()
    assert summary["updates"] == 10
    (event,) = [e for e in FAULTS.events if e[0] == "engine_rebuilds"]
    # rebuilt with the weights the dead engine served (v - k, or v - k - 1 when the rebuild came between an
    # update and its snapshot's push), not the learner's v; and the lag held for every batch after it
    ((given, learner_at),) = rebuilds
    assert learner_at > K + 1 and given == event[3]["version"] and learner_at - K - 1 <= given <= learner_at - K
    for j, batch in enumerate(batches):
        assert max(s.version for t in batch for s in t.segments) <= max(0, j - K)
