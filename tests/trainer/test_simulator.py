"""The pipeline simulator: staleness properties of each policy at scale, determinism, the CLI."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from agentenv.errors import ConfigError
from agentenv.trainer.experiments.sim_result import format_table
from agentenv.trainer.experiments.simulator import (
    SIM_POLICIES,
    EpisodeSample,
    SimConfig,
    _Sim,
    compare,
    main,
    simulate,
)
from agentenv.trainer.setup import turn_policy_tokens

# Generation outpaces training here (the asynchronous case where staleness control matters).
BASE = SimConfig(num_trajectories=3000, batch_size=32, concurrency=256, train_step_s=5.0, seed=3)


@pytest.fixture(scope="module")
def runs():
    sims = {}
    for p in SIM_POLICIES:
        sim = _Sim(replace(BASE, policy=p), keep_decisions=True)
        sims[p] = (sim, sim.run())
    return sims


def test_sync_has_no_staleness(runs):
    _, r = runs["sync"]
    assert r.consumed >= 2900 and r.gs.size == r.consumed
    assert np.all(r.gs == 0) and np.all(r.ws == 0) and r.rejected == 0
    # no overlap: generation and training never run at the same time
    assert r.generator_busy + r.trainer_busy <= 1.0 + 1e-9


def test_none_never_rejects_and_is_stalest(runs):
    none = runs["none"][1]
    assert none.rejected == 0 and none.rejection_rate == 0.0
    for p in ("pace", "pace_share", "max_lag"):
        assert none.s.mean() > runs[p][1].s.mean() + 1.0
    assert none.summary()["occupancy_mean"] > 3 * BASE.batch_size  # the pool just grows


def test_pace_holds_occupancy_near_target(runs):
    # Before each selection the pool holds what arrived during the last step (~50 here, inflow > B),
    # so "near target" means bounded at a small multiple of B, not growing, unlike "none".
    none = runs["none"][1].occupancy_at_select
    none_late = none[len(none) // 2 :].mean()
    for p in ("pace", "pace_share"):
        r = runs[p][1]
        o = r.occupancy_at_select
        early, late = o[: len(o) // 2], o[len(o) // 2 :]
        assert late.mean() < 2.5 * BASE.batch_size, p
        assert late.mean() <= early.mean() + BASE.batch_size, p
        assert none_late > 4 * late.mean(), p
        assert r.rejected > 0 and 0 < r.rejection_rate < 0.9
        assert r.ws.mean() < runs["none"][1].ws.mean() / 4  # waiting staleness is what PACE controls


def test_max_lag_respects_cap(runs):
    r = runs["max_lag"][1]
    assert r.s.max() <= BASE.max_lag + 1e-9 and r.rejected > 0


def test_conservation_and_trajectory_invariants(runs):
    for p, (sim, r) in runs.items():
        assert r.completed == r.consumed + r.rejected + len(sim.pool), p
        assert r.consumed % BASE.batch_size == 0  # whole batches; the last may still be training
        assert r.consumed // BASE.batch_size - r.updates in (0, 1)
        assert 0 <= r.generator_busy <= 1 and 0 <= r.trainer_busy <= 1 and r.tokens_per_s > 0
    kept_prefix = 0
    for t in runs["none"][0].pool.trajectories:
        assert sum(t.loss_mask) == t.num_policy_tokens
        vs = [s.version for s in t.segments]
        assert vs == sorted(vs) and max(vs) <= t.completion_version and t.start_version <= min(vs)
        assert all(s.prefix_version <= s.version for s in t.segments)
        kept_prefix += any(s.prefix_version < s.version for s in t.segments)  # KEEP-mode continuation
        # A turn's prefill runs under the weights current when the turn starts (prefix recomputed
        # after a tool call); an update before its first token leaves prefix_version < version.
        assert t.segments[0].prefix_version == t.start_version
        for prev, s in zip(t.segments, t.segments[1:], strict=False):
            if s.start == prev.end:  # interrupted mid-turn: new version, KV cache (prefix) kept
                assert s.version > prev.version and s.prefix_version == prev.prefix_version
            else:  # a new turn after a tool call: prefix computed no earlier than the last tokens
                assert prev.version <= s.prefix_version <= s.version
        assert t.generation_staleness() >= 0
    assert kept_prefix > 0


def test_histograms_cover_every_consumed_trajectory(runs):
    r = runs["pace"][1]
    h = r.histograms(bin_width=0.5)
    for name in ("gs", "ws", "s"):
        counts, edges = h[name]
        assert counts.sum() == r.consumed and edges[0] == 0.0 and np.allclose(np.diff(edges), 0.5)
    assert runs["sync"][1].histograms()["s"][0][0] == runs["sync"][1].consumed  # all in [0, 0.5)
    with pytest.raises(ConfigError):
        r.histograms(0)


def test_decisions_are_logged(runs):
    sim, r = runs["pace"]
    assert len(sim.decisions) == len(r.occupancy_at_select)
    assert sum(d["rejected_count"] for d in sim.decisions) == r.rejected
    d = next(d for d in sim.decisions if d["rejected"])
    assert {"gs", "ws", "s_eff", "f", "w"} <= set(d["rejected"][0])


def test_deterministic_with_seed():
    cfg = replace(BASE, num_trajectories=600, policy="pace")
    a, b = simulate(cfg), simulate(cfg)
    assert a.summary() == b.summary()
    np.testing.assert_array_equal(a.gs, b.gs)
    c = simulate(replace(cfg, seed=4))
    assert c.summary() != a.summary()


def test_compare_and_table():
    rs = compare(replace(BASE, num_trajectories=300), ("sync", "none"))
    table = format_table(rs)
    assert [r.policy for r in rs] == ["sync", "none"] and len(table.splitlines()) == 3


def test_main_cli(capsys):
    assert main(["--policy", "all", "--num-trajectories", "300", "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert all(p in out for p in SIM_POLICIES)
    assert main(["--policy", "bogus"]) == 2
    assert main(["--batch-size", "0"]) == 2


def test_config_errors():
    with pytest.raises(ConfigError):
        SimConfig(concurrency=0)
    with pytest.raises(ConfigError):
        SimConfig(gamma=-1.0)
    with pytest.raises(ConfigError):
        SimConfig(tokens_mean=0.5)
    with pytest.raises(ConfigError):
        simulate(SimConfig(policy="all"))


def test_hand_computed_interrupts_keep_prefix_version():
    # 2 slots, 100 tokens in one turn at 10 tok/s, 4 s per update, no sync pause, B = 1.
    # t=0..10: two episodes under v0, complete at t=10 (v_c=0); the learner trains on the first 10->14,
    # on the second 14->18 (WS = 1). Episodes 3, 4 start at t=10: 40 tokens under v0, 40 under v1
    # (update at 14), 20 under v2 (update at 18), prefix kept from v0; complete at t=20 with v_c=2:
    # GS = (40*2 + 40*1 + 20*0)/100 = 1.2. The run stops at the 4th completion, after the 3rd is taken.
    cfg = SimConfig(
        policy="none", batch_size=1, concurrency=2, num_trajectories=4, tokens_mean=100, tokens_sigma=0.0,
        turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.0, train_step_s=4.0,
        weight_sync_s=0.0, prompt_tokens=1, obs_tokens=0,
    )
    sim = _Sim(cfg, keep_decisions=False)
    r = sim.run()
    np.testing.assert_allclose(r.gs, [0.0, 0.0, 1.2])
    np.testing.assert_allclose(r.ws, [0.0, 1.0, 0.0])
    assert r.sim_time_s == pytest.approx(20.0) and r.updates == 2
    (last,) = sim.pool.trajectories
    assert [(s.num_tokens, s.version, s.prefix_version) for s in last.segments] == [
        (40, 0, 0), (40, 1, 0), (20, 2, 0)]
    assert last.completion_version == 2 and last.start_version == 0
    assert r.trainer_busy == pytest.approx(8 / 20)


def test_hand_computed_affine_decode_step():
    # Two sequences of 100 tokens in one turn decode together; a step of n = 2 takes 0.1 + 0.05 * 2 =
    # 0.2 s, so both finish at 20 s; alone (concurrency 1) a step takes 0.15 s: 15 s.
    base = dict(policy="none", batch_size=1, num_trajectories=2, tokens_mean=100, tokens_sigma=0.0,
                turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.05, train_step_s=1.0, weight_sync_s=0.0)
    both = simulate(SimConfig(concurrency=2, **base))
    np.testing.assert_allclose(both.episode_s, [20.0, 20.0])
    alone = simulate(SimConfig(concurrency=1, **base))
    np.testing.assert_allclose(alone.episode_s, [15.0, 15.0])
    assert both.tokens_per_s == pytest.approx(200 / 20)


def test_hand_computed_shared_compute():
    # One slot, B = 1, 100 tokens at 10 tok/s alone, a 4 s step alone; both slow down 2x when both run.
    # t 0-10: episode 1 alone. t 10-18: the step (8 s at half speed) beside episode 2 (40 tokens at 5
    # tok/s); t 18-24: episode 2's other 60 tokens alone; t 24-32: the second step beside episode 3
    # (40 tokens), which finishes alone at 38 and is taken at once. Episodes 2 and 3: 40 tokens one
    # version before their completion, 60 at it: GS = 0.4.
    cfg = SimConfig(policy="none", batch_size=1, concurrency=1, num_trajectories=3, tokens_mean=100,
                    tokens_sigma=0.0, turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.0, train_step_s=4.0,
                    weight_sync_s=0.0, train_slows_decode=2.0, decode_slows_train=2.0)
    r = simulate(cfg)
    assert r.sim_time_s == pytest.approx(38.0) and r.updates == 2
    np.testing.assert_allclose(r.episode_s, [10.0, 14.0, 14.0])
    np.testing.assert_allclose(r.gs, [0.0, 0.4, 0.4])
    assert r.trainer_busy == pytest.approx(16 / 38)


def test_hand_computed_back_pressure():
    # Two slots, B = 1, at most one trajectory waiting or playing; 100 tokens at 10 tok/s, a 30 s step.
    # One episode plays at a time: episode 1 plays 0-10 and is taken at once (WS 0); episode 2 plays
    # 10-20 and waits through the step; at 40 it is taken (WS 1) and episode 3 plays 40-50; at 70 the
    # second step ends, episode 3 is taken (WS 1: it completed at version 1) and episode 4 plays 70-80.
    cfg = SimConfig(policy="none", batch_size=1, concurrency=2, num_trajectories=4, tokens_mean=100,
                    tokens_sigma=0.0, turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.0,
                    train_step_s=30.0, weight_sync_s=0.0, max_pool_size=1)
    r = simulate(cfg)
    np.testing.assert_allclose(r.ws, [0.0, 1.0, 1.0])
    assert r.sim_time_s == pytest.approx(80.0) and r.updates == 2
    # a cap of 2: both slots play 0-10; episode 1 is taken at 10 and episode 3 takes its place (10-20)
    # while episode 2 waits; the step ends at 40: episode 2 taken (WS 1), episode 4 plays 40-50
    two = simulate(replace(cfg, max_pool_size=2))
    np.testing.assert_allclose(two.ws, [0.0, 1.0])
    assert two.sim_time_s == pytest.approx(50.0) and two.updates == 1
    unbounded = simulate(replace(cfg, max_pool_size=None))
    assert unbounded.sim_time_s == pytest.approx(20.0)  # the slots never idle: 4 episodes by t = 20


def test_batches_without_gradient_take_no_step():
    cfg = replace(BASE, policy="none", num_trajectories=3200, no_step_share=0.25, seed=5)
    r = simulate(cfg)
    assert r.batches == r.consumed // BASE.batch_size
    assert 0.15 < (r.batches - r.updates) / r.batches < 0.35  # about a quarter, for ~100 batches
    stepped = simulate(replace(cfg, no_step_share=0.0))
    assert stepped.batches - stepped.updates in (0, 1)


def test_max_batches_stops_after_the_last_step():
    r = simulate(replace(BASE, policy="pace", num_trajectories=10**9, max_batches=7, weight_sync_s=0.5))
    assert r.batches == 7 and r.updates == 7 and r.consumed == 7 * BASE.batch_size


def test_episode_sample_is_drawn_as_measured():
    sample = EpisodeSample(np.array([10, 30]), np.array([1, 3]))
    cfg = replace(BASE, policy="none", concurrency=8, num_trajectories=100, tool_latency_mean_s=0.0, train_step_s=1e6)
    sim = _Sim(cfg, keep_decisions=False, episodes=sample)
    sim.run()
    pairs = {(t.num_policy_tokens, len(turn_policy_tokens(t))) for t in sim.pool.trajectories}
    assert pairs == {(10, 1), (30, 3)}
    with pytest.raises(ConfigError):
        EpisodeSample(np.array([10, 0]), np.array([1, 1]))
    with pytest.raises(ConfigError):
        EpisodeSample(np.array([10]), np.array([1, 1]))


def test_new_settings_are_validated():
    for bad in (dict(max_pool_size=4, batch_size=8), dict(no_step_share=1.0), dict(train_slows_decode=0.5),
                dict(decode_base_s=0.0, decode_per_seq_s=0.0), dict(decode_per_seq_s=-1.0), dict(max_batches=0)):
        with pytest.raises(ConfigError):
            SimConfig(**bad)


def test_hand_computed_step_overhead():
    # Two slots at 10 tok/s, 100-token episodes, a 4 s step and 3 s of checks after it, B = 1, 3 batches.
    # t 10: episodes 1, 2 complete; 1 is trained 10-14, checks to 17; 2 is trained 17-21, checks to 24;
    # episode 3 (started at 10, done at 20 under v1) is trained 24-28 at v2 (WS 1), checks to 31.
    # Without the checks: the steps run 10-14, 14-18 and 20-24.
    cfg = SimConfig(policy="none", batch_size=1, concurrency=2, num_trajectories=10**6, max_batches=3,
                    tokens_mean=100, tokens_sigma=0.0, turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.0,
                    train_step_s=4.0, weight_sync_s=0.0, step_overhead_s=3.0)
    r = simulate(cfg)
    assert r.sim_time_s == pytest.approx(31.0) and r.updates == 3
    np.testing.assert_allclose(r.ws, [0.0, 1.0, 1.0])
    assert simulate(replace(cfg, step_overhead_s=0.0)).sim_time_s == pytest.approx(24.0)


def test_episode_sample_with_a_measured_split_per_turn():
    sample = EpisodeSample(np.array([60, 12]), np.array([2, 1]), ((50, 10), (12,)))
    cfg = replace(BASE, policy="none", concurrency=8, num_trajectories=100, tool_latency_mean_s=0.0, train_step_s=1e6)
    sim = _Sim(cfg, keep_decisions=False, episodes=sample)
    sim.run()
    assert {tuple(turn_policy_tokens(t)) for t in sim.pool.trajectories} == {(50, 10), (12,)}
    with pytest.raises(ConfigError):
        EpisodeSample(np.array([60]), np.array([2]), ((50, 9),))  # does not add up


def test_hand_computed_weight_copy_window():
    # One slot at 10 tok/s, 100-token episodes, a 4 s step, then 2 s of weight copy: the learner is at
    # v1 from t = 14, the engine samples v0 until t = 16. Episode 2 (t 10-20): 60 tokens under v0, 40
    # under v1, completed at v1: GS 0.6 (0.4 when the engine switches at the step's end).
    cfg = SimConfig(policy="none", batch_size=1, concurrency=1, num_trajectories=10**6, max_batches=2,
                    tokens_mean=100, tokens_sigma=0.0, turns_mean=1.0, decode_base_s=0.1, decode_per_seq_s=0.0,
                    train_step_s=4.0, weight_sync_s=0.0, weight_copy_s=2.0)
    sim = _Sim(cfg, keep_decisions=False)
    r = sim.run()
    np.testing.assert_allclose(r.gs, [0.0, 0.6])
    assert r.sim_time_s == pytest.approx(26.0) and r.trainer_busy == pytest.approx(12 / 26)
    np.testing.assert_allclose(simulate(replace(cfg, weight_copy_s=0.0)).gs, [0.0, 0.4])
