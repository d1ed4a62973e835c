"""What one update reports about its own stability: the importance ratio's tail, and the filter's failed rows."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.trainer.learners.config import ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.learners.update_step import prepare_batch, ratio_tail

from .conftest import make_trajectories, tiny_model


def test_ratio_tail_by_hand():
    logs = [torch.tensor([0.0, math.log(2.0)]), torch.tensor([math.log(0.5)] + [0.0] * 97)]
    tail = ratio_tail(logs)
    # 100 values: one log 2, one log 0.5, 98 zeros. The 99th percentile (linear, position 0.99 * 99 = 98.01)
    # lies between the sorted values 98 (0.0) and 99 (log 2): 0.01 * log 2
    assert tail["gate/rho_p99"] == pytest.approx(2.0 ** 0.01, rel=1e-7)  # float32 inputs
    assert tail["gate/rho_max"] == pytest.approx(2.0) and tail["gate/rho_min"] == pytest.approx(0.5)
    assert ratio_tail([]) == {} and ratio_tail([torch.zeros(0)]) == {}
    assert "gate/rho_truncated_fraction" not in tail  # the option is off


def test_ratio_tail_counts_the_truncated_ratios():
    # ratios 3, 2 (= C: not truncated), 1.5, 0.5 and 100 (log 300 clamped to e^30 first): 2 of 5 above C = 2
    logs = [torch.tensor([math.log(3.0), math.log(2.0), math.log(1.5)], dtype=torch.float64),
            torch.tensor([math.log(0.5), 300.0], dtype=torch.float64)]
    assert ratio_tail(logs, is_truncation=2.0)["gate/rho_truncated_fraction"] == pytest.approx(2 / 5)
    assert ratio_tail(logs, is_truncation=math.inf)["gate/rho_truncated_fraction"] == 0.0
    assert ratio_tail(logs, is_truncation=0.1)["gate/rho_truncated_fraction"] == 1.0


def test_an_update_logs_the_ratio_tail_of_its_tokens():
    model = tiny_model(3)
    learner = Learner(model, OptimConfig(lr=1e-3), objective=ObjectiveConfig(delta=10.0))
    trajs = make_trajectories(4, seed=3, rewards=[1, 0, 1, 0])  # behaviour log-probs unrelated to the model
    scores = learner.score(trajs)
    stats = learner.update(trajs)
    metrics = stats.to_metrics()
    log_ratios = torch.cat([s - torch.tensor([lp for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True)
                                              if m]) for s, t in zip(scores, trajs, strict=True)])
    assert metrics["gate/rho_max"] == pytest.approx(float(log_ratios.max().exp()), rel=1e-4)
    assert metrics["gate/rho_p99"] == pytest.approx(float(torch.quantile(log_ratios.double(), 0.99).exp()), rel=1e-4)
    assert metrics["gate/rho_p99"] <= metrics["gate/rho_max"]
    assert "gate/rho_truncated_fraction" not in metrics
    # truncated importance sampling with C between the two middle ratios: the upper half of the tokens is above it
    ordered = log_ratios.double().sort().values
    k = len(ordered) // 2
    cap = float(((ordered[k - 1] + ordered[k]) / 2).exp())
    learner = Learner(tiny_model(3), OptimConfig(lr=1e-3), objective=ObjectiveConfig(delta=10.0, is_truncation=cap))
    fraction = learner.update(trajs).to_metrics()["gate/rho_truncated_fraction"]
    assert fraction == pytest.approx((len(ordered) - k) / len(ordered))


@pytest.mark.parametrize("clip_negative", [False, True])
def test_failed_rows_are_marked_before_negative_advantages_are_clipped(clip_negative):
    trajs = make_trajectories(4, seed=1, rewards=[1, 0, 0, 1])
    cfg = ObjectiveConfig(delta=10.0, entropy_keep_fraction=0.5, advantage_clip_negative=clip_negative)
    batch, _ = prepare_batch(trajs, None, cfg, pad_token_id=0)
    assert batch.failed.tolist() == [False, True, True, False]
    expected = [0.5, 0.0, 0.0, 0.5] if clip_negative else [0.5, -0.5, -0.5, 0.5]
    assert batch.advantages.tolist() == expected


def test_the_entropy_filter_acts_under_clipped_negatives():
    # with A = max(A, 0) the failed rows carry no gradient, but the filter still applies to them: the
    # tokens kept are the successes' T_i plus ceil(q T_i) of each failure's (every row is admitted)
    trajs = make_trajectories(4, seed=1, rewards=[1, 0, 0, 1])
    lengths = [sum(t.loss_mask) for t in trajs]
    learner = Learner(tiny_model(1), OptimConfig(lr=1e-3),
                      objective=ObjectiveConfig(delta=10.0, entropy_keep_fraction=0.5, advantage_clip_negative=True))
    stats = learner.update(trajs)
    filtered = lengths[0] + lengths[3] + math.ceil(0.5 * lengths[1]) + math.ceil(0.5 * lengths[2])
    assert stats.objective.kept_tokens == filtered < sum(lengths)
