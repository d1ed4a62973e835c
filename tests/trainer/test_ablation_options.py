"""The ablation options of ``agentenv study``: ``objective.advantage_clip_negative`` and
``objective.loss_aggregation``, against hand-computed advantages and gradients."""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.learner_config import ObjectiveConfig, OptimConfig
from agentenv.trainer.objectives import flash_reinforce_loss
from agentenv.trainer.update_step import prepare_batch
from tests.trainer.conftest import make_trajectories


def test_advantage_clip_negative_keeps_only_positive_advantages():
    trajs = make_trajectories(4, rewards=[1.0, 0.0, 0.0, 1.0])
    full, _ = prepare_batch(trajs, None, ObjectiveConfig(), pad_token_id=0)
    clipped, _ = prepare_batch(trajs, None, ObjectiveConfig(advantage_clip_negative=True), pad_token_id=0)
    order = [full.source_index.index(k) for k in range(4)]  # row of trajectory k
    assert [float(full.advantages[i]) for i in order] == [0.5, -0.5, -0.5, 0.5]
    assert [float(clipped.advantages[i]) for i in order] == [0.5, 0.0, 0.0, 0.5]
    grpo = ObjectiveConfig(name="grpo", grpo_group_size=2, advantage_clip_negative=True)
    g, _ = prepare_batch(make_trajectories(4, rewards=[1.0, 0.0, 0.0, 0.0]), None, grpo, pad_token_id=0)
    # group (1, 0): (r - 0.5) / std 0.7071 = +-0.7071, clipped to (0.7071, 0); group (0, 0): zeros
    assert torch.allclose(g.advantages, torch.tensor([2 ** -0.5, 0.0, 0.0, 0.0]), atol=1e-4)


def _grad(total_tokens):
    # rows of T = 1 and T = 3 policy tokens, on-policy (rho = 1), A = (+1, -1), B = 2
    lq = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    out = flash_reinforce_loss(lq, lq.detach().clone(), mask, torch.tensor([1.0, -1.0]), torch.tensor([1, 3]), 2,
                               delta=10.0, total_tokens=total_tokens)
    out.loss.backward()
    return lq.grad


def test_token_mean_weighs_every_token_one_over_n():
    # sample mean: d L / d log pi = -A_i / (B T_i): -1/2 for row 0, +1/6 for each token of row 1
    assert torch.allclose(_grad(None), torch.tensor([[-0.5, 0, 0], [1 / 6, 1 / 6, 1 / 6]]))
    # token mean, N = 4: -A_i / N: -1/4 and +1/4 per token
    assert torch.allclose(_grad(4), torch.tensor([[-0.25, 0, 0], [0.25, 0.25, 0.25]]))
    with pytest.raises(DataError, match="total_tokens=3 is below this call's 4"):
        _grad(3)
    with pytest.raises(ConfigError, match="loss_aggregation"):
        ObjectiveConfig(loss_aggregation="row_mean")


def test_the_learner_trains_with_token_mean():
    from agentenv.trainer.learner import Learner
    from tests.trainer.conftest import tiny_model

    trajs = make_trajectories(4, rewards=[1.0, 0.0, 0.0, 1.0])
    grads = {}
    for agg in ("sample_mean", "token_mean"):
        learner = Learner(tiny_model(), OptimConfig(lr=1e-3),
                          objective=ObjectiveConfig(loss_aggregation=agg, delta=100.0))
        stats = learner.update(trajs)
        assert stats.stepped and stats.version == 1
        grads[agg] = stats.grad_norm
    assert grads["sample_mean"] > 0 and grads["token_mean"] > 0
    assert grads["sample_mean"] != pytest.approx(grads["token_mean"], rel=1e-3)  # a different gradient
