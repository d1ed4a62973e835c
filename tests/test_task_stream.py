"""The task stream: the order tasks and group members are handed out, the requeue, checkpoints."""

from __future__ import annotations

import pytest

from agentenv.errors import DataError
from agentenv.rollout.task_stream import TaskStream


def test_members_of_the_oldest_open_group_come_before_a_new_task():
    s = TaskStream(first_seed=10, group_size=2)
    jobs = [s.next_job() for _ in range(3)]
    assert [(g.seed, g.key, m) for g, m in jobs] == [(10, 0, 0), (10, 0, 1), (11, 1, 0)]
    first = jobs[0][0]
    first.todo.appendleft(1)  # member 1 failed: it is played again before anything else
    again, m = s.next_job()
    assert (again, m) == (first, 1) and s.next_seed == 12
    assert [g.seed for g in s.open_groups] == [10, 11]
    s.close(first)
    s.close(first)  # twice is harmless
    assert [g.seed for g in s.open_groups] == [11]


def test_a_requeued_task_is_played_before_fresh_ones_and_counts_its_plays():
    s = TaskStream(first_seed=0, group_size=1)
    g0, _ = s.next_job()
    s.close(g0)
    s.requeue(0)
    s.requeue(5)
    assert s.requeued == [0, 5]
    replay, _ = s.next_job()
    assert (replay.seed, replay.play) == (0, 1)  # the second group of seed 0
    assert s.next_job()[0].seed == 5 and s.next_job()[0].seed == 1 and s.requeued == []


def test_max_groups_opens_no_group_past_the_limit():
    s = TaskStream(first_seed=0, group_size=2)
    s.next_job(max_groups=1)
    s.next_job(max_groups=1)  # both members of group 0 handed out
    assert s.next_job(max_groups=1) is None
    assert s.next_job(max_groups=2)[0].seed == 1


def test_state_dict_round_trip_requeues_the_open_groups_first():
    s = TaskStream(first_seed=3, group_size=1)
    s.next_job()
    s.next_job()  # seeds 3 and 4 open
    s.requeue(1)
    state = s.state_dict()
    assert state == {"next_seed": 5, "in_flight": [3, 4], "requeued": [1]}
    t = TaskStream(first_seed=0, group_size=1)
    assert t.load_state_dict(state) == [3, 4]
    assert [t.next_job()[0].seed for _ in range(4)] == [3, 4, 1, 5]


def test_a_bad_state_leaves_the_stream_unchanged():
    s = TaskStream(first_seed=7, group_size=1)
    with pytest.raises(DataError, match="bad collector state"):
        s.load_state_dict({"next_seed": 1, "in_flight": ["x"]})
    with pytest.raises(DataError):
        s.load_state_dict({"in_flight": []})
    assert s.state_dict() == {"next_seed": 7, "in_flight": [], "requeued": []}
