"""GRPO groups are real groups: n rollouts of one task, contiguous in the batch, a baseline per task.

The training loop runs for real (see ``test_loop_failures.py`` for the scripted model side); the
environment's prompt depends on the task seed, so a group of one task shares one prompt.
"""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import ConfigError
from agentenv.trainer.learners.update_step import prepare_batch
from agentenv.trainer.recipe import parse_args
from tests.fakes import CountdownEnv
from tests.trainer.test_loop_failures import FlakyEnv, _train, scripted  # noqa: F401 (scripted: a fixture)

pytestmark = pytest.mark.timeout(120)

GRPO = ["objective.name=grpo", "objective.grpo_group_size=4", "run.batch_size=8", "run.max_pool_size=16"]


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["objective.name=grpo", "objective.grpo_group_size=1", "run.batch_size=8"], "grpo_group_size >= 2"),
        (["objective.name=grpo", "objective.grpo_group_size=3", "run.batch_size=8"],
         r"run.batch_size \(8\) must be a multiple of objective.grpo_group_size \(3\)"),
        (["run.max_task_retries=3"], "max_task_retries is no longer a setting: it is fixed at 2"),
    ],
)
def test_mixed_prompt_groups_are_config_errors(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_args(argv)


def test_flash_reinforce_needs_no_group_multiple():
    cfg, _ = parse_args(["run.batch_size=6", "run.max_pool_size=12"])  # grpo_group_size 8 is ignored
    assert cfg.objective.name == "flash_reinforce"
    cfg, _ = parse_args(["objective.name=grpo", "objective.grpo_group_size=4", "run.batch_size=8"])
    assert (cfg.objective.name, cfg.objective.grpo_group_size, cfg.run.batch_size) == ("grpo", 4, 8)


def _check_groups(batch, n, cfg):
    assert len(batch) == 8
    for i in range(0, len(batch), n):
        group = batch[i : i + n]
        assert len({t.task_id for t in group}) == 1
        assert len({t.info["group"] for t in group}) == 1
        assert len({tuple(t.token_ids[: t.prompt_length]) for t in group}) == 1  # one prompt
        assert sorted(t.info["member"] for t in group) == list(range(n))
    policy_batch, _ = prepare_batch(batch, None, cfg.objective, 0)
    adv = policy_batch.advantages.view(-1, n)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(len(batch) // n), atol=1e-5, rtol=0)
    rewards = torch.tensor([t.reward for t in batch]).view(-1, n)
    mixed = rewards.std(dim=1) > 0
    assert (adv[mixed].abs().sum(dim=1) > 0).all()  # a group with mixed rewards gets a signal
    return int(mixed.sum())


@pytest.mark.parametrize("policy, env", [("pace", CountdownEnv), ("sync", CountdownEnv), ("max_lag", FlakyEnv)])
def test_a_grpo_batch_is_whole_groups_of_one_task(tmp_path, scripted, policy, env):  # noqa: F811
    summary, _ = _train(tmp_path, env, scripted, *GRPO, "--policy", policy, "--updates", "2")
    assert summary["updates"] == 2
    cfg, _ = parse_args(GRPO)
    assert len(scripted.batches) >= 2  # a batch without gradient takes no step
    mixed = 0
    for batch in scripted.batches:
        assert all(t.status == "completed" and t.num_policy_tokens > 0 for t in batch)
        mixed += _check_groups(batch, 4, cfg)
    assert mixed >= 1  # the scripted replies vary within a group, so advantages are not all 0
