"""``setup.update_metrics`` and ``setup.consumed_record``: the per-batch figures from hand-made trajectories."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from agentenv.trainer import setup

from .conftest import make_trajectories


def _row(batch):
    selection = SimpleNamespace(batch=batch, decision=SimpleNamespace(occupancy=0.5, rejected_count=1, rate=0.25))
    stats = SimpleNamespace(to_dict=lambda: {"loss": 0.1})
    collector = SimpleNamespace(episodes_finished=9, errors=0, report_counts=lambda: {"failed": 0})
    return setup.update_metrics(3, selection, stats, [], collector, 0.5, 1.5, time.time(), consumed_at=2)


def test_the_truncated_share_counts_token_budget_endings_only():
    batch = make_trajectories(4)
    # a token budget (per turn, total), the environment's own truncation (not a budget), and none
    for traj, ending in zip(batch, ("max_total_tokens", "max_new_tokens_per_turn", "env", None), strict=True):
        traj.info.update(truncation=ending, turns=2, tool_calls=1)
    row = _row(batch)
    assert row["length/truncated"] == 0.5
    assert row["length/turns"] == 2 and row["tools/calls"] == 1
    assert row["length/policy_tokens"] == pytest.approx(sum(t.num_policy_tokens for t in batch) / 4)
    assert [setup.consumed_record(t, 3)["truncation"] for t in batch] == [
        "max_total_tokens", "max_new_tokens_per_turn", "env", None]
    batch[2].info["truncation"] = "context"  # the context window is a token budget too
    assert _row(batch)["length/truncated"] == 0.75


def test_grading_timeouts_count_the_answers_graded_wrong_for_a_timeout():
    batch = make_trajectories(4)
    assert _row(batch)["grading/timeouts"] == 0
    batch[0].info.update(grading_timeout=True, grade_reason="timeout after 5 s")
    batch[3].info.update(grading_timeout=True, grade_reason="timeout after 5 s")
    batch[1].info.update(grading_timeout=False, grade_reason="wrong")
    assert _row(batch)["grading/timeouts"] == 2


def test_the_consumed_record_carries_what_the_simulator_replays():
    (traj,) = make_trajectories(1)
    traj.start_version, traj.completion_version, traj.start_time, traj.completion_time = 2, 4, 100.0, 112.5
    rec = setup.consumed_record(traj, 5)
    assert (rec["start_version"], rec["completion_version"], rec["version"]) == (2, 4, 5)
    assert rec["completion_time"] - rec["start_time"] == 12.5
    assert rec["tokens"] == len(traj.token_ids) and rec["policy_tokens"] == sum(traj.loss_mask)
    assert rec["ws"] == 1  # consumed at 5, completed at 4


def test_turn_policy_tokens_join_the_segments_of_one_reply():
    from agentenv.trajectory import Segment, Trajectory

    # reply 1: tokens 10-25, split by a weight update at 20; an observation 25-40; reply 2: 40-48
    segs = [Segment(10, 20, 0, 0), Segment(20, 25, 1, 0), Segment(40, 48, 1, 1)]
    traj = Trajectory(token_ids=[0] * 48, loss_mask=[0] * 10 + [1] * 15 + [0] * 15 + [1] * 8,
                      behaviour_logprobs=[0.0] * 48, segments=segs, prompt_length=10)
    assert setup.turn_policy_tokens(traj) == [15, 8]
    assert setup.consumed_record(traj, 1)["turn_policy_tokens"] == [15, 8]
