"""The learning-rate schedule (values per step), its bad inputs, and optimizer settings applied on resume."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.errors import ConfigError
from agentenv.trainer.learners.config import ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.lr_schedule import decay_length, lr_factor, warmup_length

from .conftest import make_trajectories, tiny_model


def _factors(schedule, warmup, total, ratio=0.1, steps=None, decay=None):
    return [lr_factor(s, schedule=schedule, warmup_steps=warmup, total_steps=total, min_lr_ratio=ratio,
                      decay_steps=decay)
            for s in range(steps if steps is not None else total)]


def test_constant_with_and_without_warmup():
    assert _factors("constant", 0, 4) == [1.0, 1.0, 1.0, 1.0]
    assert _factors("constant", 4, 6) == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert _factors("constant", 0, None, steps=3) == [1.0, 1.0, 1.0]  # no horizon needed


def test_cosine_by_hand():
    # W = 2, N = 6, r = 0.1: warm-up 1/2, 1; then p = 1/4, 2/4, 3/4, 4/4 -> 0.1 + 0.9 (1 + cos(pi p)) / 2
    expected = [0.5, 1.0] + [0.1 + 0.45 * (1 + math.cos(math.pi * p)) for p in (0.25, 0.5, 0.75, 1.0)]
    assert _factors("cosine", 2, 6) == pytest.approx(expected, abs=1e-12)
    assert expected[2:] == pytest.approx([0.868198, 0.55, 0.231802, 0.1], abs=1e-6)
    # past the horizon (a resumed run that was extended) it stays at the floor
    assert lr_factor(9, schedule="cosine", warmup_steps=2, total_steps=6, min_lr_ratio=0.1) == pytest.approx(0.1)
    # no warm-up: the last of N steps runs at r, the first just under the peak
    assert _factors("cosine", 0, 4, ratio=0.0) == pytest.approx([0.853553, 0.5, 0.146447, 0.0], abs=1e-6)


def test_wsd_by_hand():
    # W = 2, N = 8, D = 3, r = 0.1: warm-up 1/2, 1; the peak for steps 2-4; then p = 1/3, 2/3, 1
    decay = [0.1 + 0.45 * (1 + math.cos(math.pi * p)) for p in (1 / 3, 2 / 3, 1.0)]
    assert _factors("wsd", 2, 8, decay=3) == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0] + decay, abs=1e-12)
    assert decay == pytest.approx([0.775, 0.325, 0.1], abs=1e-12)
    # D = N - W is the cosine schedule, step for step
    assert _factors("wsd", 2, 8, decay=6) == pytest.approx(_factors("cosine", 2, 8), abs=1e-15)
    # a one-step run decays in its one step; past the horizon the floor stays
    assert _factors("wsd", 0, 1, decay=1) == [pytest.approx(0.1)]
    assert lr_factor(11, schedule="wsd", warmup_steps=2, total_steps=8, min_lr_ratio=0.1,
                     decay_steps=3) == pytest.approx(0.1)


@pytest.mark.parametrize("ratio, total, expected",
                         [(0.25, 28, 7), (0.2, 10, 2), (0.2, 4, 1), (0.01, 12, 1), (1.0, 5, 5)])
def test_the_wsd_decay_is_a_share_of_the_run_rounded_down_and_at_least_one_step(ratio, total, expected):
    assert decay_length(OptimConfig(decay_ratio=ratio), total) == expected


@pytest.mark.parametrize("warmup, decay, total", [(2, 7, 8), (0, 0, 8), (0, 3, None)])
def test_a_wsd_geometry_that_does_not_fit_the_run_is_refused(warmup, decay, total):
    with pytest.raises(ConfigError, match="'wsd' needs a warm-up"):
        lr_factor(5, schedule="wsd", warmup_steps=warmup, total_steps=total, min_lr_ratio=0.1, decay_steps=decay)


def test_the_learner_steps_with_the_scheduled_lr():
    learner = Learner(tiny_model(0), OptimConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=1),
                      objective=ObjectiveConfig(delta=10.0),
                      total_steps=3)
    lrs = []
    for k in range(3):
        stats = learner.update(make_trajectories(4, seed=k, rewards=[1, 0, 1, 0]))
        assert stats.stepped
        lrs.append(stats.lr)
    # step 0: warm-up 1/1; step 1: p = 1/2 -> 0.1 + 0.9 * 0.5; step 2: p = 1 -> the floor 0.1
    assert lrs == pytest.approx([1e-3, 5.5e-4, 1e-4], rel=1e-9)


@pytest.mark.parametrize("ratio, total, expected", [
    (0.2, 12, 2), (0.2, 10, 2), (0.2, 36, 7), (0.2, 4, 0), (0.2, 1, 0), (0.03, 1000, 30), (0.0, 12, 0),
])
def test_warmup_ratio_is_a_share_of_the_run_rounded_down(ratio, total, expected):
    assert warmup_length(OptimConfig(warmup_ratio=ratio), total) == expected
    assert warmup_length(OptimConfig(warmup_steps=3), total) == 3  # a step count ignores the horizon


def test_a_ratio_warmup_schedules_like_the_same_step_warmup():
    by_ratio = Learner(tiny_model(0), OptimConfig(lr=1e-3, lr_schedule="cosine", warmup_ratio=0.25), total_steps=8)
    by_steps = Learner(tiny_model(0), OptimConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=2), total_steps=8)
    factors = [f(s) for f in by_ratio.scheduler.lr_lambdas for s in range(8)]
    assert factors == [f(s) for f in by_steps.scheduler.lr_lambdas for s in range(8)]
    assert factors[:3] == pytest.approx([0.5, 1.0, 0.1 + 0.45 * (1 + math.cos(math.pi / 6))])


def test_the_default_recipe_runs_a_one_update_smoke_run_under_its_cosine_schedule():
    from agentenv.trainer.recipe import parse_args

    cfg, _ = parse_args(["--updates", "1"])
    assert (cfg.optim.lr_schedule, warmup_length(cfg.optim, 1)) == ("cosine", 0)
    default, _ = parse_args([])
    assert (default.run.updates, warmup_length(default.optim, default.run.updates)) == (24, 4)
    # the lr of each of the default run's 24 updates: a quarter of 1.5e-5 more per warm-up update, then
    # cosine down to 1.5e-6 at the last
    o = default.optim
    lrs = [o.lr * lr_factor(s, schedule=o.lr_schedule, warmup_steps=4, total_steps=24, min_lr_ratio=o.min_lr_ratio)
           for s in range(24)]
    by_hand = [3.75e-6, 7.5e-6, 1.125e-5, 1.5e-5] + [1.5e-6 + 1.35e-5 * (1 + math.cos(math.pi * k / 20)) / 2
                                                     for k in range(1, 21)]
    assert lrs == pytest.approx(by_hand, rel=1e-12)
    # halfway through the decay: the mean of 1.5e-5 and 1.5e-6
    assert lrs[-1] == pytest.approx(1.5e-6) and lrs[13] == pytest.approx(8.25e-6)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["optim.lr_schedule=linear"], "optim.lr_schedule: 'linear' is not one of ('constant', 'cosine', 'wsd')"),
        (["optim.lr_schedule=wsd", "optim.decay_ratio=0"], "optim.decay_ratio"),
        (["optim.lr_schedule=wsd", "optim.decay_ratio=1.5"], "optim.decay_ratio"),
        (["optim.lr_schedule=wsd", "optim.warmup_ratio=0.5", "optim.decay_ratio=0.6", "--updates", "10"],
         "the warm-up (5 updates) and the decay (6 updates"),
        (["optim.lr_schedule=cosine", "optim.warmup_ratio=0", "optim.warmup_steps=13", "--updates", "12"],
         "optim.warmup_steps (13) is longer than the run"),
        (["optim.warmup_ratio=0", "optim.warmup_steps=12", "--updates", "12"], "needs steps after the warm-up"),
        (["optim.min_lr_ratio=-0.1"], "optim.min_lr_ratio"),
        (["optim.min_lr_ratio=1.5"], "optim.min_lr_ratio"),
        (["optim.betas=[0.9, 1.0]"], "optim.betas must be two numbers in [0, 1)"),
        (["optim.betas=[-0.1, 0.95]"], "optim.betas must be two numbers in [0, 1)"),
        (["optim.adam_eps=0"], "optim.adam_eps must be > 0"),
        (["optim.warmup_ratio=1.0"], "optim.warmup_ratio (the warm-up's share of the run) must lie in [0, 1)"),
        (["optim.warmup_ratio=-0.1"], "optim.warmup_ratio"),
        (["optim.warmup_ratio=0.1", "optim.warmup_steps=2"], "both set: give the warm-up one way"),
    ],
)
def test_bad_schedule_settings_are_config_errors_before_anything_loads(argv, needle):
    from agentenv.trainer.recipe import parse_args

    with pytest.raises(ConfigError) as err:
        parse_args(argv)
    assert needle in str(err.value)


def test_resume_applies_the_new_optimizer_settings_and_keeps_the_moments(tmp_path):
    old = OptimConfig(lr=1e-3, betas=(0.9, 0.999), adam_eps=1e-8, weight_decay=0.0, lr_schedule="cosine",
                      warmup_steps=1)
    learner = Learner(tiny_model(0), old, objective=ObjectiveConfig(delta=10.0), total_steps=4)
    for k in range(2):
        learner.update(make_trajectories(4, seed=k, rewards=[1, 0, 1, 0]))
    learner.save(tmp_path / "ckpt")
    moments = {k: v.clone() for k, v in learner.optimizer.state_dict()["state"][0].items()}

    new = OptimConfig(lr=1e-4, betas=(0.9, 0.95), adam_eps=1e-6, weight_decay=0.1, lr_schedule="cosine",
                      warmup_steps=1)
    resumed = Learner(tiny_model(1), new, objective=ObjectiveConfig(delta=10.0), total_steps=4)
    resumed.restore(tmp_path / "ckpt")
    group = resumed.optimizer.param_groups[0]
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.9, 0.95), 1e-6, 0.1)
    # two steps taken: step 2 of W = 1, N = 4 has p = 2/3 -> 0.1 + 0.45 (1 + cos(2 pi / 3)) = 0.325 x the new peak
    assert group["lr"] == pytest.approx(1e-4 * 0.325, rel=1e-9)
    assert resumed.scheduler.get_last_lr() == [group["lr"]] and resumed.scheduler.last_epoch == 2
    restored = resumed.optimizer.state_dict()["state"][0]
    for key, value in moments.items():  # Adam's moments and step count come from the checkpoint
        assert torch.equal(restored[key], value)
    stats = resumed.update(make_trajectories(4, seed=5, rewards=[1, 0, 1, 0]))
    assert stats.lr == pytest.approx(1e-4 * 0.325, rel=1e-9)
    assert resumed.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 * 0.1, rel=1e-9)


def test_the_learner_steps_with_the_wsd_schedule():
    learner = Learner(tiny_model(0), OptimConfig(lr=1e-3, lr_schedule="wsd", warmup_steps=1, decay_ratio=0.5),
                      objective=ObjectiveConfig(delta=10.0), total_steps=4)
    lrs = [learner.update(make_trajectories(4, seed=k, rewards=[1, 0, 1, 0])).lr for k in range(4)]
    # W = 1, D = 2 of N = 4: warm-up 1/1, the peak, then p = 1/2 -> 0.55, p = 1 -> 0.1
    assert lrs == pytest.approx([1e-3, 1e-3, 5.5e-4, 1e-4], rel=1e-9)


def test_a_schedule_with_a_horizon_is_refused_without_one():
    with pytest.raises(ConfigError, match="'wsd' needs"):
        Learner(tiny_model(0), OptimConfig(lr=1e-3, lr_schedule="wsd", warmup_steps=1))


def test_resume_with_the_same_settings_changes_nothing(tmp_path, caplog):
    cfg, objective = OptimConfig(lr=1e-3), ObjectiveConfig(delta=10.0)
    learner = Learner(tiny_model(0), cfg, objective=objective)
    learner.update(make_trajectories(4, seed=0, rewards=[1, 0, 1, 0]))
    learner.save(tmp_path / "ckpt")
    resumed = Learner(tiny_model(0), cfg, objective=objective)
    with caplog.at_level("WARNING"):
        resumed.restore(tmp_path / "ckpt")
    assert "resume: optim" not in caplog.text
    assert resumed.optimizer.param_groups[0]["lr"] == 1e-3
