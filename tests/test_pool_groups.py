"""TrajectoryPool with GRPO groups: every staleness policy keeps groups whole (property test over random pools)."""

from __future__ import annotations

import numpy as np
import pytest

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.pool import TrajectoryPool
from agentenv.rollout.staleness import StalenessConfig
from agentenv.trajectory import Trajectory

pytestmark = pytest.mark.timeout(60)


def member(task: str, k: int, v_c: int, segs: list[tuple[int, int]]) -> Trajectory:
    t = Trajectory(task_id=task, completion_version=v_c, id=f"{task}/{k}")
    t.append_environment_tokens([7, 7])
    for n, v in segs:
        t.append_policy_tokens([1] * n, [-1.0] * n, v, segs[0][1])
        t.append_environment_tokens([7])
    t.info["group"] = task
    return t


def random_group(rng, task: str, n: int, v_now: int) -> list[Trajectory]:
    out = []
    for k in range(n):
        v0 = int(rng.integers(0, v_now))
        segs, v = [], v0
        for _ in range(int(rng.integers(1, 4))):
            segs.append((int(rng.integers(1, 6)), v))
            v = min(v + int(rng.integers(0, 3)), v_now)
        out.append(member(task, k, min(v + int(rng.integers(0, 2)), v_now), segs))
    return out


def scorer_for(rng):
    def score(trajs):
        return [-rng.uniform(0.0, 3.0, size=t.num_policy_tokens) for t in trajs]

    return score


POLICIES = [
    StalenessConfig(policy="none"),
    StalenessConfig(policy="sync"),
    StalenessConfig(policy="max_lag", max_lag=3.0),
    StalenessConfig(policy="max_lag", max_lag=4.0),
    StalenessConfig(policy="pace", drift_mode="token_share", beta=0.0),
    StalenessConfig(policy="pace", drift_mode="token_share", beta=0.5, target_occupancy=6),
    StalenessConfig(policy="pace", drift_mode="scoring", beta=0.0, gamma=2.0),
]


def assert_whole_groups(trajs: list[Trajectory], n: int) -> None:
    assert len(trajs) % n == 0
    for i in range(0, len(trajs), n):
        assert len({t.task_id for t in trajs[i : i + n]}) == 1, [t.id for t in trajs]
    assert len({t.task_id for t in trajs}) == len(trajs) // n  # each task once


@pytest.mark.parametrize("cfg", POLICIES, ids=lambda c: f"{c.policy}-{c.drift_mode}-{c.max_lag}")
def test_every_policy_takes_and_rejects_whole_groups(cfg):
    rng = np.random.default_rng(POLICIES.index(cfg))
    tasks = 0
    group_rejections = 0
    for _ in range(40):
        n = int(rng.integers(1, 5))
        b = n * int(rng.integers(1, 4))
        v_now = int(rng.integers(3, 12))
        pool = TrajectoryPool(cfg, group_size=n)
        for _ in range(int(rng.integers(0, 10))):
            pool.add_group(random_group(rng, f"task{tasks}", n, v_now))
            tasks += 1
        for _ in range(3):
            before = pool.trajectories
            sel = pool.select_batch(b, v_now, drift_scorer=scorer_for(rng))
            assert len(sel.batch) in (0, b)
            if sel.batch:
                assert_whole_groups(sel.batch, n)
            assert_whole_groups(sel.rejected, n)
            group_rejections += bool(sel.rejected) and n > 1
            assert_whole_groups(pool.trajectories, n)
            assert sel.decision.rejected_count == len(sel.rejected)
            if cfg.policy == "pace":
                assert sel.decision.budget % n == 0
                if sel.batch:
                    assert sel.decision.budget == len(sel.rejected)
            # the batch is the oldest remaining rows, in completion order
            gone = {t.id for t in sel.rejected}
            remaining = [t for t in before if t.id not in gone]
            if sel.batch:
                assert [t.id for t in sel.batch] == [t.id for t in remaining[:b]]
            if cfg.policy == "max_lag":  # no member of a kept group is over the cap
                for t in sel.batch:
                    lag = v_now - min(t.token_versions())
                    assert lag <= cfg.max_lag + 1e-9
            if cfg.policy in ("none", "sync"):
                assert sel.rejected == []
            v_now += int(rng.integers(0, 2))
    if cfg.policy in ("max_lag", "pace"):
        assert group_rejections >= 3  # the property was exercised on groups, not only on n = 1


def test_pace_budget_counts_groups_and_rejects_the_stalest_group():
    # 4 groups of 2 at v_now 10, B = 2 (one group), target 2 rows: e = 6/8, r = .75 (beta 0);
    # k = round(.75 * 4 groups) = 3, capped at 4 - ceil(2 / 2) = 3 groups -> keep one group.
    pool = TrajectoryPool(StalenessConfig(policy="pace", drift_mode="token_share", beta=0.0), group_size=2)
    for i, v in enumerate([9, 6, 10, 8]):
        pool.add_group([member(f"g{i}", 0, v, [(2, v)]), member(f"g{i}", 1, v, [(2, v)])])
    sel = pool.select_batch(2, 10)
    assert sel.decision.budget == 6 and len(sel.rejected) == 6
    assert [t.task_id for t in sel.batch] == ["g2", "g2"]
    assert [t.task_id for t in sel.rejected] == ["g1", "g1", "g3", "g3", "g0", "g0"]  # stalest first


def test_a_group_is_as_stale_as_its_stalest_member():
    # group a: both members WS 1; group b: one member WS 5 -> max_lag 3 rejects b whole
    pool = TrajectoryPool(StalenessConfig(policy="max_lag", max_lag=3.0), group_size=2)
    pool.add_group([member("a", 0, 9, [(2, 9)]), member("a", 1, 9, [(2, 9)])])
    pool.add_group([member("b", 0, 5, [(2, 5)]), member("b", 1, 10, [(2, 10)])])
    sel = pool.select_batch(2, 10)
    assert [t.id for t in sel.batch] == ["a/0", "a/1"] and [t.id for t in sel.rejected] == ["b/0", "b/1"]


def test_group_usage_errors_and_checkpoint():
    pool = TrajectoryPool(StalenessConfig(policy="none"), group_size=2)
    with pytest.raises(ConfigError):
        pool.add(member("a", 0, 1, [(2, 1)]))
    with pytest.raises(DataError, match="has 2 trajectories"):
        pool.add_group([member("a", 0, 1, [(2, 1)])])
    with pytest.raises(DataError, match="one task"):
        pool.add_group([member("a", 0, 1, [(2, 1)]), member("b", 0, 1, [(2, 1)])])
    with pytest.raises(DataError, match="no policy token"):
        pool.add_group([member("a", 0, 1, [(2, 1)]), Trajectory(task_id="a", id="empty")])
    assert len(pool) == 0  # a bad group adds nothing
    pool.add_group([member("a", 0, 1, [(2, 1)]), member("a", 1, 1, [(2, 1)])])
    with pytest.raises(ConfigError, match="whole number of groups"):
        pool.select_batch(3, 2)
    state = pool.state_dict()
    fresh = TrajectoryPool(StalenessConfig(policy="none"), group_size=2)
    fresh.load_state_dict(state)
    assert [t.id for t in fresh.trajectories] == ["a/0", "a/1"]
    with pytest.raises(DataError, match="groups of"):
        TrajectoryPool(StalenessConfig(policy="none")).load_state_dict(state)
    with pytest.raises(ConfigError):
        TrajectoryPool(group_size=0)
