"""The learner's settings in three sections: ``optim`` (AdamW), ``objective`` (the loss), ``learner`` (execution)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from agentenv.errors import ConfigError
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.recipe import parse_args


def test_each_value_lives_in_exactly_one_section():
    names = [{f.name for f in dataclasses.fields(c)} for c in (OptimConfig, ObjectiveConfig, LearnerConfig)]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])
    # every value that left optim for another section names its new place, and that place exists
    for old, new in OptimConfig.MOVED_FIELDS.items():
        if " " in new:  # a value that is no longer a setting says what replaced it
            continue
        section, field = new.split(".")
        assert field in names[{"objective": 1, "learner": 2}[section]], (old, new)


@pytest.mark.parametrize("override, new", [
    ("optim.delta=0.1", "objective.delta"),
    ("optim.objective=grpo", "objective.name"),
    ("optim.max_tokens_per_micro_batch=512", "learner.max_tokens_per_micro_batch"),
])
def test_an_old_optim_key_names_where_it_lives_now(override, new):
    with pytest.raises(ConfigError, match=rf"is now {new}"):
        parse_args([override])


@pytest.mark.parametrize("override, now", [
    ("learner.ray_address=auto", "is now Ray's own RAY_ADDRESS environment variable"),
    ("learner.share_prefix=false", "is now always on where the model allows it"),
    ("optim.share_prefix=true", "is now always on where the model allows it"),
    ("staleness.requeue_rejected=false", "is now always on"),
    ("staleness.max_lag_measure=mean", "is now always the oldest token's lag"),
])
def test_a_value_that_is_no_longer_a_setting_says_what_replaced_it(override, now):
    with pytest.raises(ConfigError, match=now):
        parse_args([override])


def test_the_recipe_fills_all_three_sections():
    cfg, _ = parse_args([])
    assert (cfg.optim.lr, cfg.optim.lr_schedule, cfg.optim.warmup_ratio) == (1.5e-5, "cosine", 0.2)
    assert (cfg.objective.name, cfg.objective.delta, cfg.objective.gate) == ("flash_reinforce", 0.15, "sequence")
    assert (cfg.learner.backend, cfg.learner.micro_batch_size, cfg.learner.max_tokens_per_micro_batch) == \
        ("single", 16, 384)
    cfg, _ = parse_args(["objective.delta=0.05", "learner.max_tokens_per_micro_batch=256", "optim.lr=1e-5"])
    assert (cfg.objective.delta, cfg.learner.max_tokens_per_micro_batch, cfg.optim.lr) == (0.05, 256, 1e-5)


def _sections(cls):
    """``(dotted prefix, dataclass)`` for ``cls`` and every config section nested in it."""
    yield "", cls
    for f in dataclasses.fields(cls):
        if callable(f.default_factory) and dataclasses.is_dataclass(f.default_factory):
            for prefix, inner in _sections(f.default_factory):
                yield f"{f.name}.{prefix}", inner


def test_a_value_fixed_in_code_loads_from_an_old_config_at_that_value_and_is_refused_at_any_other():
    from agentenv.trainer.config import TrainConfig

    fixed = [(prefix + key, value) for prefix, cls in _sections(TrainConfig)
             for key, (value, _) in getattr(cls, "FIXED_FIELDS", {}).items()]
    assert {key for key, _ in fixed} == {"run.max_task_retries", "run.mode", "objective.truncation_penalty",
                                         "objective.loss_constant", "warmup.num_examples", "eval.samples_per_problem"}
    default = parse_args([])[0]
    for key, value in fixed:
        section, field = key.rsplit(".", 1)
        assert field not in {f.name for f in dataclasses.fields(getattr(default, section))}, key
        assert parse_args([f"{key}={json.dumps(value)}"])[0] == default, key
        other = "sync" if isinstance(value, str) else 3 if value is None else value + 1
        with pytest.raises(ConfigError, match=rf"{key} is no longer a setting: it is fixed at {value!r}"):
            parse_args([f"{key}={json.dumps(other)}"])
