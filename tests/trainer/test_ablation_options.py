"""The ablation options of ``agentenv study``: ``objective.advantage_clip_negative``,
``objective.loss_aggregation`` (with the learner's ``loss_constant``) and ``objective.is_truncation``, against
hand-computed advantages, losses and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.learners.config import ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.update_step import prepare_batch
from agentenv.trainer.objectives import flash_reinforce_loss
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


def _grad(total_tokens, loss_constant=None, with_loss=False):
    # rows of T = 1 and T = 3 policy tokens, on-policy (rho = 1), A = (+1, -1), B = 2
    lq = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -2.0, -0.5]], requires_grad=True)
    mask = torch.tensor([[True, False, False], [True, True, True]])
    out = flash_reinforce_loss(lq, lq.detach().clone(), mask, torch.tensor([1.0, -1.0]), torch.tensor([1, 3]), 2,
                               delta=10.0, total_tokens=total_tokens, loss_constant=loss_constant)
    out.loss.backward()
    return (lq.grad, float(out.loss.detach())) if with_loss else lq.grad


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
    from agentenv.trainer.learners.single import Learner
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


def test_constant_normaliser_divides_every_row_by_k():
    # constant, K = 4: d L / d log pi = -A_i / (B K) = -1/8 for row 0's token, +1/8 for each of row 1's
    grad, loss = _grad(None, loss_constant=4, with_loss=True)
    assert torch.allclose(grad, torch.tensor([[-0.125, 0, 0], [0.125, 0.125, 0.125]]))
    # L = -(1/B) sum_i (A_i / K) sum_t log pi = -(1/2) (1/4 (-1) - 1/4 (-1 - 2 - 0.5)) = -0.3125
    assert loss == pytest.approx(-0.3125)
    # rows weigh in proportion to T_i: row 1's total is 3 times row 0's (sample mean: equal totals)
    assert float(grad[1].sum()) == pytest.approx(-3 * float(grad[0].sum()))
    with pytest.raises(ConfigError, match="one normaliser"):
        _grad(4, loss_constant=4)
    with pytest.raises(ConfigError, match="loss_constant"):
        _grad(None, loss_constant=0)


def test_the_learner_takes_a_loss_constant_only_for_the_constant_aggregation():
    from agentenv.trainer.learners.update_step import check_objective_constant

    constant = ObjectiveConfig(loss_aggregation="constant")
    assert check_objective_constant(constant, 384) == 384
    for bad in (0, -5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="loss_constant"):
            check_objective_constant(constant, bad)
    with pytest.raises(ConfigError, match="needs the learner's loss_constant"):
        check_objective_constant(constant, None)
    with pytest.raises(ConfigError, match="not of 'sample_mean'"):
        check_objective_constant(ObjectiveConfig(), 384)  # a constant that no aggregation would use
    with pytest.raises(ConfigError, match="GRPO is always token-mean"):
        ObjectiveConfig(name="grpo", grpo_group_size=2, loss_aggregation="constant")


def test_the_loss_constant_is_the_rollouts_policy_token_budget():
    from agentenv.configio import load_config
    from agentenv.trainer.learners.backends import loss_constant
    from agentenv.trainer.recipe import parse_args

    cfg, _ = parse_args(["objective.loss_aggregation=constant", "rollout.max_turns=3",
                         "rollout.max_new_tokens_per_turn=50", "rollout.max_total_tokens=400"])
    assert loss_constant(cfg) == 150  # 3 x 50
    cfg, _ = parse_args(["objective.loss_aggregation=constant", "rollout.max_turns=3",
                         "rollout.max_new_tokens_per_turn=50", "rollout.max_total_tokens=120"])
    assert loss_constant(cfg) == 120  # the total budget binds first
    assert loss_constant(parse_args([])[0]) is None
    # a config saved when the constant was a setting loads at its default (null), and refuses another value
    assert load_config(ObjectiveConfig, {"loss_aggregation": "constant", "loss_constant": None}) == \
        ObjectiveConfig(loss_aggregation="constant")
    with pytest.raises(ConfigError, match="loss_constant is no longer a setting"):
        load_config(ObjectiveConfig, {"loss_aggregation": "constant", "loss_constant": 64})


def _tis_inputs():
    # row 0: T = 2, rho = (0.6/0.2, 0.25/0.5) = (3, 0.5); row 1: T = 1, rho = 0.3/0.2 = 1.5; A = (+1, -1), B = 2
    lq = torch.tensor([[math.log(0.6), math.log(0.25)], [math.log(0.3), float("nan")]], dtype=torch.float64,
                      requires_grad=True)
    lp = torch.tensor([[math.log(0.2), math.log(0.5)], [math.log(0.2), float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False]])
    return lq, lp, mask, torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([2, 1])


def _tis(**kw):
    lq, lp, mask, adv, lengths = _tis_inputs()
    out = flash_reinforce_loss(lq, lp, mask, adv, lengths, 2, gate="none", **kw)
    out.loss.backward()
    return out, lq.grad


def test_truncated_importance_sampling_caps_rho_at_c():
    out, grad = _tis(is_truncation=2.0)
    # min(rho, 2) = (2, 0.5) and 1.5; d L / d log pi = -A_i min(rho, C) / (B T_i)
    expected = torch.tensor([[-2 / 4, -0.5 / 4], [1.5 / 2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(grad, expected, rtol=1e-12, atol=0)
    # L = -(1/B) sum_i (A_i / T_i) sum_t min(rho, C) log pi
    loss = -0.5 * (0.5 * (2 * math.log(0.6) + 0.5 * math.log(0.25)) - 1.5 * math.log(0.3))
    assert float(out.loss.detach()) == pytest.approx(loss, rel=1e-12)
    assert out.stats.surrogate_sum == pytest.approx(-0.5 * (0.5 * 2.5 - 1.5), rel=1e-12)
    assert out.stats.rho_sum == pytest.approx(3 + 0.5 + 1.5)  # the ratio before truncation
    _, untruncated = _tis()
    assert float(untruncated[0, 0]) == pytest.approx(-3 / 4)  # the capped token; the others are as with C
    assert torch.equal(untruncated[:, 1:], grad[:, 1:]) and untruncated[1, 0] == grad[1, 0]


def test_truncation_at_infinity_or_off_is_todays_loss_exactly():
    base, g_base = _tis()
    for c in (None, math.inf, 4.0):  # 4.0: above the largest ratio (3), nothing is capped
        out, g = _tis(is_truncation=c)
        assert torch.equal(out.loss, base.loss) and torch.equal(g, g_base)


@pytest.mark.parametrize("bad", [0, 0.0, -1.0, float("nan"), True])
def test_a_cap_not_above_zero_is_a_config_error(bad):
    with pytest.raises(ConfigError, match="objective.is_truncation"):
        ObjectiveConfig(is_truncation=bad)
    with pytest.raises(ConfigError, match="is_truncation"):
        _tis(is_truncation=bad)


def test_a_cap_not_above_zero_fails_before_anything_loads():
    from agentenv.trainer.recipe import parse_args

    with pytest.raises(ConfigError, match="objective.is_truncation"):
        parse_args(["objective.is_truncation=0"])
    cfg, _ = parse_args(["objective.is_truncation=2.5"])
    assert cfg.objective.is_truncation == 2.5
    with pytest.raises(ConfigError, match="GRPO clips its own ratio"):
        ObjectiveConfig(name="grpo", grpo_group_size=2, is_truncation=2.0)
