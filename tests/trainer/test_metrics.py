"""MetricsWriter: JSONL and TensorBoard records of real updates."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pytest

from agentenv.errors import ClosedError
from agentenv.trainer.learners.config import ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.metrics import MetricsWriter, flatten

from .conftest import make_trajectories, tiny_model


@dataclass(frozen=True)
class _Decision:  # shaped like a pool decision record
    occupancy: int
    rejected: int
    ws: list


def test_update_metrics_to_jsonl_and_tensorboard(tmp_path):
    learner = Learner(tiny_model(0), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    trajs = make_trajectories(4, seed=0, rewards=[1, 0, 0, 0])
    with MetricsWriter(tmp_path) as w:
        for _ in range(2):
            st = learner.update(trajs)
            decision = _Decision(occupancy=9, rejected=2, ws=[1, 2, 3])
            w.log(learner.version, {**st.to_metrics(), **flatten(decision, "pool"), "note": 1.5})
        w.log(3, {"a": float("nan"), "nested": {"b": 2}})
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    r = lines[0]
    assert r["reward/mean"] == 0.25 and r["gate/admitted_fraction"] == 1.0
    assert r["pool/occupancy"] == 9 and r["pool/rejected"] == 2 and r["pool/ws"] == 2.0 and r["note"] == 1.5
    assert r["train/grad_norm"] > 0 and r["perf/tokens_per_second"] > 0
    assert lines[2]["a"] is None and lines[2]["nested/b"] == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2]
    assert math.isclose(loss[0].value, r["train/loss"], rel_tol=1e-6, abs_tol=1e-9)
    w.close()  # twice is fine
    with pytest.raises(ClosedError):
        w.log(4, {"x": 1})


def test_flatten():
    assert flatten({"a": {"b": {"c": 1}}, "d": [2, 4], "e": "s"}) == {"a/b/c": 1, "d": 3.0, "e": "s"}
