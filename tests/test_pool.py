"""TrajectoryPool: hand-computed PACE decisions, the other policies, logging, requeue and checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.pool import LENGTH_BINS, TrajectoryPool, length_bin, rejection_by_length
from agentenv.rollout.staleness import StalenessConfig
from agentenv.trajectory import Trajectory


def make_traj(name: str, v_c: int, segs: list[tuple[int, int]]) -> Trajectory:
    """Prompt of 3 tokens, then policy segments ``(n_tokens, version)`` separated by one env token."""
    t = Trajectory(task_id=f"task-{name}", completion_version=v_c, id=name)
    t.append_environment_tokens([7, 7, 7])
    prefix = segs[0][1]
    for n, v in segs:
        t.append_policy_tokens([1] * n, [-1.0] * n, v, prefix)
        t.append_environment_tokens([7])
    return t


# The worked example, v_now = 10, B = 2 (GS, WS by hand):
#   A: v_c=6, 10 tok @v6              GS = 0                 WS = 4  share 0
#   B: v_c=8, 2 tok @v2 + 6 tok @v8   GS = 2*6/8 = 1.5       WS = 2  share .25
#   C: v_c=9, 2 tok @v6 + 6 tok @v9   GS = 2*3/8 = 0.75      WS = 1  share .25
#   D: v_c=9, 5 tok @v1 + 5 tok @v9   GS = 5*8/10 = 4        WS = 1  share .5
# Scorer drift on older-segment tokens: B |0.1|,|0.3| -> f=.2; C .5,.5 -> .5; D .1 x5 -> .1; A none -> 0.
# Newest-segment tokens get |diff| = 7, which must not count.
# Ranks of f (A 0, D .1, B .2, C .5): u = .25, .5, .75, 1 -> w = u^4 = .00390625, .0625, .31640625, 1
# S_eff: A 4, B 2 + .31640625*1.5 = 2.474609375, C 1 + .75 = 1.75, D 1 + .0625*4 = 1.25
# beta = 0: r = e = (4 - 2)/4 = .5, budget round(.5 * 4) = 2 -> reject A, B; batch [C, D].
OLDER_DIFFS = {"A": [], "B": [0.1, -0.3], "C": [0.5, 0.5], "D": [0.1] * 5}


def four() -> list[Trajectory]:
    return [
        make_traj("A", 6, [(10, 6)]),
        make_traj("B", 8, [(2, 2), (6, 8)]),
        make_traj("C", 9, [(2, 6), (6, 9)]),
        make_traj("D", 9, [(5, 1), (5, 9)]),
    ]


class Scorer:
    """Returns mu + diff on older-segment tokens and mu - 7 on the newest segment; counts calls."""

    def __init__(self, as_tensor: bool = False) -> None:
        self.calls: list[list[str]] = []
        self.as_tensor = as_tensor

    def __call__(self, trajs):
        self.calls.append([t.id for t in trajs])
        out = []
        for t in trajs:
            d = OLDER_DIFFS[t.id]
            q = np.full(t.num_policy_tokens, -8.0)
            q[: len(d)] = -1.0 + np.asarray(d, dtype=float) if d else q[:0]
            q = np.minimum(q, 0.0)
            out.append(torch.tensor(q, dtype=torch.float32) if self.as_tensor else q)
        return out


def pool_of(cfg: StalenessConfig, trajs: list[Trajectory]) -> TrajectoryPool:
    p = TrajectoryPool(cfg)
    for t in trajs:
        p.add(t)
    return p


def ids(ts):
    return [t.id for t in ts]


def test_summary_columns_match_trajectory_methods():
    for t, (gs, share) in zip(four(), [(0.0, 0.0), (1.5, 0.25), (0.75, 0.25), (4.0, 0.5)], strict=True):
        assert t.generation_staleness() == pytest.approx(gs)
        assert t.older_segment_token_share() == pytest.approx(share)


@pytest.mark.parametrize("as_tensor", [False, True])
def test_pace_scoring_hand_computed(as_tensor):
    scorer = Scorer(as_tensor)
    pool = pool_of(StalenessConfig(policy="pace", beta=0.0), four())
    sel = pool.select_batch(2, 10, scorer)
    assert ids(sel.rejected) == ["A", "B"]
    assert ids(sel.batch) == ["C", "D"]  # completion order
    assert len(pool) == 0
    d = sel.decision
    assert (d.occupancy, d.target, d.excess, d.rate, d.budget, d.rejected_count) == (4, 2, 0.5, 0.5, 2, 2)
    rec = json.loads(json.dumps(d.to_dict()))
    rej = {r["id"]: r for r in rec["rejected"]}
    selected = {r["id"]: r for r in rec["selected"]}
    assert rej["A"]["gs"] == 0 and rej["A"]["ws"] == 4 and rej["A"]["s_eff"] == pytest.approx(4.0)
    assert rej["A"]["f"] == 0 and rej["A"]["w"] == pytest.approx(0.00390625)
    assert rej["B"]["f"] == pytest.approx(0.2) and rej["B"]["w"] == pytest.approx(0.31640625)
    assert rej["B"]["s_eff"] == pytest.approx(2.474609375)
    assert selected["C"]["f"] == pytest.approx(0.5) and selected["C"]["s_eff"] == pytest.approx(1.75)
    assert selected["D"]["f"] == pytest.approx(0.1) and selected["D"]["s_eff"] == pytest.approx(1.25)
    assert scorer.calls == [["B", "C", "D"]]  # A has one version: f = 0 with no scoring
    # the scoring pass is returned for the batch, aligned with it (the learner's gate q)
    assert sel.scores is not None and [s.shape[0] for s in sel.scores] == [8, 10]
    assert sel.scores[0][0] == pytest.approx(-0.5)
    assert sel.requeue_task_ids == ["task-A", "task-B"]


def test_pace_token_share_hand_computed():
    # w = share: S_eff A 4, B 2 + .25*1.5 = 2.375, C 1 + .25*.75 = 1.1875, D 1 + .5*4 = 3 -> reject A, D
    pool = pool_of(StalenessConfig(policy="pace", beta=0.0, drift_mode="token_share"), four())
    sel = pool.select_batch(2, 10)
    assert ids(sel.rejected) == ["A", "D"] and ids(sel.batch) == ["B", "C"]
    np.testing.assert_allclose(sel.decision.rej["s_eff"], [4.0, 3.0])
    np.testing.assert_allclose(sel.decision.sel["s_eff"], [2.375, 1.1875])
    assert sel.scores is None


def test_pace_without_budget_scores_only_the_batch():
    scorer = Scorer()
    pool = pool_of(StalenessConfig(policy="pace"), four())  # beta .9: r = .05, budget round(.2) = 0
    sel = pool.select_batch(2, 10, scorer)
    assert sel.rejected == [] and ids(sel.batch) == ["A", "B"]
    assert sel.decision.budget == 0 and sel.decision.rate == pytest.approx(0.05)
    assert scorer.calls == [["A", "B"]]
    np.testing.assert_allclose(sel.decision.sel["f"], [0.0, 0.2])
    assert sel.scores is not None and len(sel.scores) == 2


def test_scores_cached_per_version():
    scorer = Scorer()
    cfg = StalenessConfig(policy="pace", beta=0.0, target_occupancy=3)
    pool = pool_of(cfg, four())
    sel = pool.select_batch(1, 10, scorer)  # e = 1/4, budget round(1) = 1 (cap 4 - 3): reject A
    assert ids(sel.rejected) == ["A"] and ids(sel.batch) == ["B"]
    assert scorer.calls == [["B", "C", "D"]]
    pool.select_batch(4, 10, scorer)  # fewer than B: waits, scores nothing
    assert len(scorer.calls) == 1
    sel = pool.select_batch(1, 10, scorer)  # budget 0, batch [C] already scored at version 10
    assert ids(sel.batch) == ["C"] and len(scorer.calls) == 1
    assert sel.scores is not None and sel.scores[0][0] == pytest.approx(-0.5)
    sel = pool.select_batch(1, 11, scorer)  # new version: rescored
    assert ids(sel.batch) == ["D"] and scorer.calls[1:] == [["D"]]


def test_pace_ties_in_drift_share_rank():
    # A, E both f = 0 -> rank 1.5 of 5, u = .3; D .6, B .8, C 1; w = u^4 = .0081 .1296 .4096 1
    # S_eff: A 4, B 2 + .4096*1.5 = 2.6144, C 1.75, D 1 + .1296*4 = 1.5184, E 1 + 0 = 1
    # e = 3/5, r = .6 (beta 0), budget 3 -> reject A, B, C; batch [D, E]
    OLDER_DIFFS["E"] = []
    try:
        pool = pool_of(StalenessConfig(policy="pace", beta=0.0), [*four(), make_traj("E", 9, [(3, 9)])])
        scorer = Scorer()
        sel = pool.select_batch(2, 10, scorer)
    finally:
        del OLDER_DIFFS["E"]
    assert ids(sel.rejected) == ["A", "B", "C"] and ids(sel.batch) == ["D", "E"]
    # single-version A, E are not scored for f; E is scored afterwards for the learner's batch scores
    assert scorer.calls == [["B", "C", "D"], ["E"]] and sel.scores is not None and len(sel.scores) == 2
    np.testing.assert_allclose(sel.decision.rej["w"], [0.0081, 0.4096, 1.0], rtol=1e-6)
    np.testing.assert_allclose(sel.decision.rej["s_eff"], [4.0, 2.6144, 1.75], rtol=1e-6)
    np.testing.assert_allclose(sel.decision.sel["w"], [0.1296, 0.0081], rtol=1e-6)


def test_none_takes_oldest_in_completion_order():
    pool = pool_of(StalenessConfig(policy="none"), four())
    sel = pool.select_batch(3, 10)
    assert ids(sel.batch) == ["A", "B", "C"] and sel.rejected == [] and len(pool) == 1
    np.testing.assert_allclose(sel.decision.sel["s_eff"], [4.0, 3.5, 1.75])  # S = GS + WS
    assert ids(pool.trajectories) == ["D"]


def test_sync_selects_like_none():
    pool = pool_of(StalenessConfig(policy="sync"), four())
    assert ids(pool.select_batch(2, 10).batch) == ["A", "B"]


def test_max_lag_caps_the_oldest_token_lag_inclusively():
    # v_now - min version: A 4, B 8, C 4, D 9; cap 4 -> reject B, D; A and C (== cap) stay
    pool = pool_of(StalenessConfig(policy="max_lag", max_lag=4), four())
    sel = pool.select_batch(2, 10)
    assert ids(sel.rejected) == ["B", "D"] and ids(sel.batch) == ["A", "C"]
    np.testing.assert_allclose(sel.decision.rej["s_eff"], [8.0, 9.0])


def test_max_lag_caps_the_oldest_token_not_the_mean():
    # E: 1 token at v5 then 19 at v10, completed at v10; v_now 10: S = 5/20 = 0.25, oldest token 5 versions old
    old_token = make_traj("E", 10, [(1, 5), (19, 10)])
    fresh = make_traj("F", 10, [(20, 9)])  # every token 1 version old
    assert old_token.staleness(10) == pytest.approx(0.25)
    cfg = StalenessConfig(policy="max_lag", max_lag=2)
    sel = pool_of(cfg, [old_token, fresh]).select_batch(1, 10)
    assert ids(sel.rejected) == ["E"] and ids(sel.batch) == ["F"]
    np.testing.assert_allclose(sel.decision.rej["s_eff"], [5.0])


def test_max_lag_rejects_even_when_learner_waits():
    pool = pool_of(StalenessConfig(policy="max_lag", max_lag=4), four())
    sel = pool.select_batch(3, 10)  # 2 left after rejection < 3: the learner waits
    assert ids(sel.rejected) == ["B", "D"] and sel.batch == [] and sel.decision.waited
    assert ids(pool.trajectories) == ["A", "C"]
    assert sel.requeue_task_ids == ["task-B", "task-D"]  # their tasks are played again


def test_rate_smoothing_over_steps():
    # B = 2, target 2, pool refilled to N = 6 before each call: e = 4/6 each step;
    # r_t = (2/3)(1 - .9^t): .0667 .1267 .1807 .2293 .2730; budget round(6 r): 0 1 1 1 2
    pool = TrajectoryPool(StalenessConfig(policy="pace", drift_mode="token_share"))
    counter = 0
    rates, budgets = [], []
    for _ in range(5):
        while len(pool) < 6:
            pool.add(make_traj(f"t{counter}", 10, [(4, 9), (4, 10)]))
            counter += 1
        sel = pool.select_batch(2, 11)
        rates.append(sel.decision.rate)
        budgets.append(sel.decision.budget)
        assert len(sel.rejected) == sel.decision.budget and len(sel.batch) == 2
    np.testing.assert_allclose(rates, [0.0666667, 0.1266667, 0.1806667, 0.2292667, 0.2730067], rtol=1e-6)
    assert budgets == [0, 1, 1, 1, 2]
    assert pool.rate == pytest.approx(0.2730067, rel=1e-6)


def test_waiting_does_not_touch_the_rate():
    pool = pool_of(StalenessConfig(policy="pace", drift_mode="token_share"), four()[:1])
    pool.rate = 0.3
    sel = pool.select_batch(2, 10)
    assert sel.batch == [] and sel.rejected == [] and sel.decision.waited
    assert pool.rate == 0.3 and len(pool) == 1


def test_no_rejection_at_or_below_target():
    pool = pool_of(StalenessConfig(policy="pace", drift_mode="token_share", target_occupancy=4), four())
    pool.rate = 0.9  # a large leftover rate: budget round(.81 * 4) = 3, capped at N - target = 0
    sel = pool.select_batch(2, 10)
    assert sel.rejected == [] and sel.decision.budget == 0 and sel.decision.excess == 0.0
    assert sel.decision.rate == pytest.approx(0.81)
    assert ids(sel.batch) == ["A", "B"]


def test_state_dict_round_trip():
    cfg = StalenessConfig(policy="pace", beta=0.5)
    a = pool_of(cfg, four())
    a.rate = 0.4
    state = json.loads(json.dumps(a.state_dict()))
    b = TrajectoryPool(cfg)
    b.load_state_dict(state)
    assert len(b) == 4 and b.rate == 0.4 and ids(b.trajectories) == ids(a.trajectories)
    sa, sb = a.select_batch(2, 10, Scorer()), b.select_batch(2, 10, Scorer())
    assert ids(sa.batch) == ids(sb.batch) and ids(sa.rejected) == ids(sb.rejected)
    assert sa.decision.to_dict() == sb.decision.to_dict()
    with pytest.raises(DataError):
        b.load_state_dict({"rate": 0.1})
    assert b.rate == sb.decision.rate  # bad state changed nothing


def test_bad_scorer_output_leaves_pool_unchanged():
    pool = pool_of(StalenessConfig(policy="pace", beta=0.0), four())
    with pytest.raises(DataError):
        pool.select_batch(2, 10, lambda ts: [np.zeros(3) for _ in ts])  # wrong length
    with pytest.raises(DataError):
        pool.select_batch(2, 10, lambda ts: [np.full(t.num_policy_tokens, 0.5) for t in ts])  # positive
    with pytest.raises(DataError):
        pool.select_batch(2, 10, lambda ts: [])  # wrong count
    assert len(pool) == 4 and pool.rate == 0.0
    assert ids(pool.select_batch(2, 10, Scorer()).batch) == ["C", "D"]  # still works afterwards


def test_usage_errors():
    pool = pool_of(StalenessConfig(policy="pace"), four())
    with pytest.raises(ConfigError):
        pool.select_batch(2, 10)  # scoring mode needs a scorer
    with pytest.raises(ConfigError):
        pool.select_batch(0, 10, Scorer())
    with pytest.raises(DataError):
        pool.select_batch(2, 8, Scorer())  # C, D completed at v9
    with pytest.raises(DataError):
        pool.add(pool.trajectories[0])  # already pooled
    with pytest.raises(DataError):
        pool.add(Trajectory(id="empty"))  # no policy token
    with pytest.raises(DataError):
        pool.add({"not": "a trajectory"})
    with pytest.raises(DataError):
        pool.add(make_traj("future", 3, [(2, 4)]))  # sampled under v4, completed at v3
    bad = make_traj("short", 5, [(4, 5)])
    bad.behaviour_logprobs = bad.behaviour_logprobs[:4]
    with pytest.raises(DataError):
        pool.add(bad)
    assert len(pool) == 4


def test_pool_grows_past_initial_capacity():
    pool = TrajectoryPool(StalenessConfig(policy="none"))
    for i in range(200):
        pool.add(make_traj(f"g{i}", i, [(2, i)]))
    sel = pool.select_batch(150, 200)
    assert ids(sel.batch) == [f"g{i}" for i in range(150)]
    np.testing.assert_allclose(sel.decision.sel["ws"], 200 - np.arange(150))
    assert ids(pool.trajectories) == [f"g{i}" for i in range(150, 200)]


def test_copy_is_independent():
    a = pool_of(StalenessConfig(policy="pace", beta=0.0), four())
    b = a.copy()
    sel = b.select_batch(2, 10, Scorer())
    assert ids(sel.batch) == ["C", "D"] and len(b) == 0
    assert len(a) == 4 and a.rate == 0.0 and ids(a.trajectories) == ["A", "B", "C", "D"]
    assert ids(a.select_batch(2, 10, Scorer()).batch) == ["C", "D"]


def test_version_change_invalidates_drift():
    scorer = Scorer()
    pool = pool_of(StalenessConfig(policy="pace", beta=0.0, target_occupancy=3), four())
    pool.select_batch(1, 10, scorer)  # scores B, C, D at v10; rejects A; batch [B]
    pool.add(make_traj("F", 10, [(2, 10)]))
    OLDER_DIFFS["F"] = []
    try:
        sel = pool.select_batch(1, 12, scorer)  # C, D, F: e = 0 -> budget 0; batch [C] rescored at v12
    finally:
        del OLDER_DIFFS["F"]
    assert scorer.calls == [["B", "C", "D"], ["C"]]
    assert ids(sel.batch) == ["C"] and sel.decision.sel["ws"][0] == 3


def test_columns_match_trajectory_methods_on_random_pools():
    rng = np.random.default_rng(7)
    trajs = []
    for i in range(60):
        v0 = int(rng.integers(0, 5))
        segs, v = [], v0
        for _ in range(int(rng.integers(1, 4))):
            segs.append((int(rng.integers(1, 9)), v))
            v += int(rng.integers(0, 3))
        trajs.append(make_traj(f"r{i}", v + int(rng.integers(0, 2)), segs))
    v_now = 12
    for cfg, check in [
        (StalenessConfig(policy="none"), lambda t: t.staleness(v_now)),
        (StalenessConfig(policy="max_lag", max_lag=99),
         lambda t: v_now - min(t.token_versions())),
        (StalenessConfig(policy="pace", drift_mode="token_share", beta=0.0, target_occupancy=60),
         lambda t: t.waiting_staleness(v_now) + t.older_segment_token_share() * t.generation_staleness()),
    ]:
        sel = pool_of(cfg, trajs).select_batch(60, v_now)
        assert ids(sel.batch) == ids(trajs)
        np.testing.assert_allclose(sel.decision.sel["gs"], [t.generation_staleness() for t in trajs])
        np.testing.assert_allclose(sel.decision.sel["ws"], [t.waiting_staleness(v_now) for t in trajs])
        np.testing.assert_allclose(sel.decision.sel["s_eff"], [check(t) for t in trajs])


def test_length_bins_are_thirds_of_the_budget():
    assert [length_bin(t, 30) for t in (1, 10, 11, 20, 21, 30, 45)] == [
        "short", "short", "medium", "medium", "long", "long", "long"]
    assert [length_bin(t, 2) for t in (0, 1, 2)] == ["short", "medium", "long"]  # 1/3 < 1 <= 4/3
    with pytest.raises(ConfigError, match="policy-token budget"):
        length_bin(5, 0)


def test_rejection_rate_by_length_of_a_hand_made_selection():
    # max_lag 4 at v_now = 10, B = 4, budget 30 (short <= 10 < medium <= 20 < long policy tokens)
    pool = TrajectoryPool(StalenessConfig(policy="max_lag", max_lag=4))
    for t in (make_traj("s_old", 2, [(3, 2)]),               # short, lag 8: rejected
              make_traj("l_old", 9, [(20, 3), (5, 9)]),      # long (25), oldest token lag 7: rejected
              make_traj("l_old2", 5, [(28, 5)]),             # long, lag 5: rejected
              make_traj("m_new", 8, [(15, 8)]),              # medium, lag 2: kept
              make_traj("s_new", 9, [(4, 9)]),               # short
              make_traj("s_new2", 10, [(2, 6), (4, 10)]),    # short (6), lag 4 = the cap: kept
              make_traj("l_new", 9, [(30, 9)])):             # long
        pool.add(t)
    sel = pool.select_batch(4, 10)
    assert [t.id for t in sel.rejected] == ["s_old", "l_old", "l_old2"]
    assert [t.id for t in sel.batch] == ["m_new", "s_new", "s_new2", "l_new"]
    m = rejection_by_length(sel.rejected, sel.batch, 30)
    # short: 1 rejected of 3 that left the pool; medium: 0 of 1; long: 2 of 3
    assert [m[f"pool/rejected_by_length/{b}"] for b in LENGTH_BINS] == [1, 0, 2]
    assert [m[f"pool/rejected_rate_by_length/{b}"] for b in LENGTH_BINS] == pytest.approx([1 / 3, 0.0, 2 / 3])
    # a bin no trajectory left the pool from has no rate
    m = rejection_by_length([], sel.batch[1:3], 30)
    assert m["pool/rejected_rate_by_length/short"] == 0.0
    assert np.isnan(m["pool/rejected_rate_by_length/medium"]) and np.isnan(m["pool/rejected_rate_by_length/long"])
