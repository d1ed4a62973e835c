"""Trajectories to padded, label-aligned tensors; splits keep the global denominators."""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import DataError
from agentenv.trainer.batching import build_batch, shard, split_micro_batches
from agentenv.trajectory import Trajectory

from .conftest import make_trajectories


def _traj(tid, env1, pol, env2=(), pol2=(), reward=0.0):
    tr = Trajectory(id=tid, reward=reward)
    tr.append_environment_tokens(list(env1))
    tr.prompt_length = len(env1)
    tr.append_policy_tokens([t for t, _ in pol], [lp for _, lp in pol], 0, 0)
    tr.append_environment_tokens(list(env2))
    tr.append_policy_tokens([t for t, _ in pol2], [lp for _, lp in pol2], 1, 0)
    return tr


def test_label_alignment_by_hand():
    a = _traj("a", [5, 6], [(7, -0.1), (8, -0.2)], [9], [(10, -0.3)], reward=1.0)
    b = _traj("b", [11], [(12, -0.5)])
    batch = build_batch([a, b], pad_token_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [11, 12, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    assert batch.labels.tolist() == [[6, 7, 8, 9, 10], [12, 0, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[False, True, True, False, True], [True, False, False, False, False]]
    torch.testing.assert_close(batch.behaviour_logprobs[0], torch.tensor([0.0, -0.1, -0.2, 0.0, -0.3]))
    assert batch.lengths.tolist() == [3, 1] and batch.rewards.tolist() == [1.0, 0.0]
    assert batch.global_batch_size == 2 and batch.global_tokens == 4 and batch.ids == ("a", "b")


def test_exclusion_and_errors():
    a = _traj("a", [5], [(7, -0.1)])
    e = Trajectory(id="e")
    e.append_environment_tokens([1, 2])
    batch = build_batch([a, e])
    assert batch.num_rows == 1 and batch.excluded_rows == 1
    with pytest.raises(DataError, match="empty batch"):
        build_batch([])
    with pytest.raises(DataError, match="none of the 1"):
        build_batch([e])
    first = Trajectory(id="first")
    first.append_policy_tokens([3], [-0.1], 0, 0)
    with pytest.raises(DataError, match="first"):
        build_batch([first])
    bad = _traj("bad", [5], [(7, -0.1)])
    bad.behaviour_logprobs[1] = float("inf")
    with pytest.raises(DataError, match="trajectory bad"):
        build_batch([bad])
    bad.behaviour_logprobs.append(0.0)
    with pytest.raises(DataError, match="trajectory bad"):
        build_batch([bad])


def test_splits_keep_global_denominators_and_rows():
    trajs = make_trajectories(7, seed=3)
    batch = build_batch(trajs)
    mbs = split_micro_batches(batch, 3)
    assert [m.num_rows for m in mbs] == [3, 3, 1]
    assert all(m.global_batch_size == 7 and m.global_tokens == batch.global_tokens for m in mbs)
    assert torch.equal(torch.cat([m.lengths for m in mbs]), batch.lengths)
    for m in mbs:  # padding trimmed to the micro-batch's longest row, content unchanged
        assert m.input_ids.shape[1] == int(m.attention_mask.sum(1).max())
        assert int(m.loss_mask.sum()) == int(m.lengths.sum())
    shards = [shard(batch, r, 2) for r in range(2)]
    assert [s.ids for s in shards] == [batch.ids[:4], batch.ids[4:]]
    assert shard(build_batch(trajs[:1]), 1, 2) is None
    with pytest.raises(DataError):
        split_micro_batches(batch, 0)
