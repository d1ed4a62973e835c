"""Guards against runs that silently learn nothing: gate metrics, batches without gradient, truncation."""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.advantages import masked_batch_mean_advantages
from agentenv.trainer.experiments.significance import paired_bootstrap, two_proportion_interval
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.learners.update_step import prepare_batch
from agentenv.trainer.trust_gate import bernoulli_kl_gate
from tests.trainer.conftest import make_trajectories, on_policy, tiny_model


def test_mean_d_is_reported_when_the_gate_comes_from_a_scoring_pass():
    learner = Learner(tiny_model(), OptimConfig(lr=1e-3),
                      objective=ObjectiveConfig(delta=0.05),
                      execution=LearnerConfig(micro_batch_size=2))
    trajs = make_trajectories(6, seed=3, rewards=[1, 0, 1, 0, 0, 0])
    scores = learner.score(trajs)
    # behaviour = current + noise: D_i > 0 on every row
    trajs = on_policy(trajs, scores, noise=0.3, seed=1)
    batch, admitted = prepare_batch(trajs, scores, learner.objective, 0)
    q = torch.zeros_like(batch.behaviour_logprobs)
    for i, k in enumerate(batch.source_index):
        q[i][batch.loss_mask[i]] = scores[k]
    d, adm = bernoulli_kl_gate(q, batch.behaviour_logprobs, batch.loss_mask, 0.05)
    assert torch.equal(adm, admitted) and float(d.min()) > 0
    stats = learner.update(trajs, scores=scores)
    # Before the fix a precomputed gate decision reported D = 0 for every row.
    assert stats.objective.mean_d == pytest.approx(float(d.mean()), rel=1e-5)
    assert stats.to_metrics()["gate/mean_d"] > 0


def _fresh(learner, seed, rewards):
    """Trajectories sampled (as it were) by the learner's current weights: lag 0, the gate admits them."""
    trajs = make_trajectories(len(rewards), seed=seed, rewards=rewards)
    return on_policy(trajs, learner.score(trajs))


def test_a_batch_without_gradient_takes_no_step_even_with_momentum():
    model = tiny_model()
    learner = Learner(model, OptimConfig(lr=1e-2, weight_decay=0.1), execution=LearnerConfig(micro_batch_size=4))
    first = learner.update(_fresh(learner, 0, [1, 0, 0, 1]))
    assert first.stepped and learner.version == 1
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flat = learner.update(_fresh(learner, 1, [1, 1, 1, 1]))
    assert not flat.stepped and learner.version == 1 and flat.grad_norm == 0.0
    # AdamW's momentum from the first step (and weight decay) would have moved every weight.
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_step_on_zero_gradient_only_bumps_the_version():
    """The opt-in: the version moves (in-flight rollouts count a version of staleness) for no change."""
    model = tiny_model()
    learner = Learner(model, OptimConfig(lr=1e-2, step_on_zero_gradient=True),
                      execution=LearnerConfig(micro_batch_size=4))
    assert learner.update(_fresh(learner, 0, [1, 0, 0, 1])).stepped
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flat = learner.update(_fresh(learner, 1, [0, 0, 0, 0]))
    assert flat.stepped and learner.version == 2
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no gradient: AdamW skips


def _cut(trajs, which):
    for i in which:
        trajs[i].info["truncation"] = "max_new_tokens_per_turn"
    trajs[-1].info["truncation"] = "max_turns"  # a turn limit is not a token-budget cut
    return trajs


def test_truncation_keep_mask_and_penalty_advantages():
    rewards = [1.0, 0.0, 1.0, 0.0]
    keep, _ = prepare_batch(_cut(make_trajectories(4, rewards=rewards), [1]), None, ObjectiveConfig(), 0)
    assert keep.advantages.tolist() == pytest.approx([0.5, -0.5, 0.5, -0.5])
    masked, _ = prepare_batch(_cut(make_trajectories(4, rewards=rewards), [1]), None,
                              ObjectiveConfig(truncation="mask"), 0)
    # baseline over rows 0, 2, 3: mean 2/3; row 1 gets 0
    assert masked.advantages.tolist() == pytest.approx([1 / 3, 0.0, 1 / 3, -2 / 3])
    pen, _ = prepare_batch(_cut(make_trajectories(4, rewards=rewards), [1]), None,
                           ObjectiveConfig(truncation="penalty"), 0)
    # TRUNCATION_PENALTY = 1: shaped rewards 1, -1, 1, 0: mean 0.25
    assert pen.advantages.tolist() == pytest.approx([0.75, -1.25, 0.75, -0.25])
    assert pen.rewards.tolist() == rewards  # the logged rewards stay the environment's


def test_masked_baseline_edge_cases():
    r = torch.tensor([1.0, 0.0, 3.0])
    assert masked_batch_mean_advantages(r, torch.tensor([True, True, True])).tolist() == pytest.approx(
        [-1 / 3, -4 / 3, 5 / 3])
    assert masked_batch_mean_advantages(r, torch.tensor([True, True, False])).tolist() == pytest.approx(
        [0.5, -0.5, 0.0])
    assert masked_batch_mean_advantages(r, torch.tensor([False, False, False])).tolist() == [0, 0, 0]
    with pytest.raises(DataError):
        masked_batch_mean_advantages(r, torch.tensor([True, False]))


@pytest.mark.parametrize("bad", [dict(truncation="drop"),
                                 dict(name="grpo", grpo_group_size=1),
                                 dict(name="grpo", grpo_group_size=4, truncation="mask")])
def test_bad_objective_settings_are_config_errors(bad):
    with pytest.raises(ConfigError):
        ObjectiveConfig(**bad)


def test_paired_bootstrap_and_two_proportion_by_hand():
    before = [0, 0, 1, 1, 0, 0, 1, 0, 0, 0] * 20  # 30%
    after = [1, 0, 1, 1, 1, 0, 1, 0, 1, 0] * 20  # 60%, every before-success kept
    paired = paired_bootstrap(before, after, resamples=2000, seed=0)
    assert paired.delta == pytest.approx(0.3) and paired.tasks == 200
    # diff is 1 on 30% of tasks, 0 elsewhere: bootstrap sd = sqrt(.3*.7/200) = 0.0324
    assert paired.low == pytest.approx(0.3 - 1.96 * 0.0324, abs=0.012)
    assert paired.high == pytest.approx(0.3 + 1.96 * 0.0324, abs=0.012)
    assert paired.excludes_zero
    unpaired = two_proportion_interval(before, after)
    se = (0.6 * 0.4 / 200 + 0.3 * 0.7 / 200) ** 0.5
    assert (unpaired.low, unpaired.high) == pytest.approx((0.3 - 1.959964 * se, 0.3 + 1.959964 * se))
    assert unpaired.high - unpaired.low > paired.high - paired.low  # pairing tightens it here
    same = paired_bootstrap(before, before, resamples=500)
    assert same.delta == 0 and same.low == 0 and same.high == 0 and not same.excludes_zero
    with pytest.raises(DataError):
        paired_bootstrap([1, 0], [1])
    with pytest.raises(DataError):
        two_proportion_interval([], [1])
