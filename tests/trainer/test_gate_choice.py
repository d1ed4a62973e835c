"""FlashREINFORCE's gate choice (``objective.gate``): sequence (the method), a token-local mask, none.

Losses, gradients and masks against hand-computed tensors, and the sequence gate as it was before the
choice existed (values recorded with the previous implementation, as float hex), to within 64 units of
``dtype``'s epsilon, relative: the vectorised log and a reduction's order differ between CPUs, and D_i
sums two terms that nearly cancel, so its last bits move (the recording machine and the CI's gave D_0 in
float64 6 ulps apart, 9e-16 relative). Any change to the formula moves the values by far more.
"""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.errors import ConfigError
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.objectives import ObjectiveStats, flash_reinforce_loss
from agentenv.trainer.trust_gate import bernoulli_kl_gate, trust_gate

from .conftest import make_trajectories, on_policy, tiny_model

NAN = float("nan")
# b = 2 rows, t = 3 positions; row 1 has 2 policy tokens (its third position is padding, NaN there)
P = [[0.5, 0.9, 0.2], [0.8, 0.3]]  # behaviour probabilities mu(a_t)
Q = [[0.5, 0.6, 0.25], [0.4, 0.3]]  # current probabilities pi_theta(a_t)
A = [0.5, -0.5]  # rewards [1, 0] minus their mean
B = 4  # the global batch: these 2 rows are a micro-batch of it


def _bkl(p: float, q: float) -> float:
    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))


# d_t by hand: d(0.5, 0.5) = 0; d(0.9, 0.6) = 0.9 ln 1.5 + 0.1 ln 0.25 = 0.2262892;
# d(0.2, 0.25) = 0.2 ln 0.8 + 0.8 ln(0.8/0.75) = 0.0070021; d(0.8, 0.4) = 0.8 ln 2 + 0.2 ln(1/3) = 0.334795;
# d(0.3, 0.3) = 0. So D_0 = 0.2332913 / 3 = 0.0777638 and D_1 = 0.3347953 / 2 = 0.1673976.
D_TOKENS = [[0.0, 0.2262892, 0.0070021], [0.3347953, 0.0]]


def _tensors(dtype=torch.float64):
    lq = torch.tensor([[math.log(x) for x in Q[0]], [math.log(Q[1][0]), math.log(Q[1][1]), NAN]], dtype=dtype)
    lp = torch.tensor([[math.log(x) for x in P[0]], [math.log(P[1][0]), math.log(P[1][1]), NAN]], dtype=dtype)
    mask = torch.tensor([[True, True, True], [True, True, False]])
    return lq.requires_grad_(True), lp, mask, torch.tensor(A, dtype=dtype), mask.sum(1)


def _expected(m):
    """Loss -(1/B) sum_i (A_i / T_i) sum_t m_it rho_it log q_it and its gradient -m_it A_i rho_it / (B T_i)."""
    loss, grad = 0.0, [[0.0] * 3 for _ in range(2)]
    for i in range(2):
        t_i = len(P[i])
        for t in range(t_i):
            if m[i][t]:
                rho = Q[i][t] / P[i][t]
                loss -= A[i] / t_i * rho * math.log(Q[i][t]) / B
                grad[i][t] = -A[i] * rho / (B * t_i)
    return loss, torch.tensor(grad, dtype=torch.float64)


def test_the_hand_computed_terms_and_row_statistics():
    for i in range(2):
        for t in range(len(P[i])):
            assert _bkl(P[i][t], Q[i][t]) == pytest.approx(D_TOKENS[i][t], abs=1e-7)
    lq, lp, mask, _, _ = _tensors()
    for gate in ("sequence", "token", "none"):  # D_i is reported whatever the gate
        dec = trust_gate(lq, lp, mask, 0.01, gate)
        torch.testing.assert_close(dec.d, torch.tensor([0.2332913 / 3, 0.3347953 / 2], dtype=torch.float64),
                                   rtol=0, atol=1e-7)


@pytest.mark.parametrize("gate, delta, rows, tokens", [
    # sequence: both D_i > 0.01 -> both rows out; at 0.1 row 0 (D = 0.078) is in, row 1 (0.167) out
    ("sequence", 0.01, [False, False], [[0, 0, 0], [0, 0, 0]]),
    ("sequence", 0.1, [True, False], [[1, 1, 1], [0, 0, 0]]),
    # token: d_t <= 0.01 keeps (0, 0.0070) of row 0 and the 0 of row 1; 0.2263 and 0.3348 are out
    ("token", 0.01, [True, True], [[1, 0, 1], [0, 1, 0]]),
    ("token", 0.25, [True, True], [[1, 1, 1], [0, 1, 0]]),
    ("token", 0.0, [True, True], [[1, 0, 0], [0, 1, 0]]),  # inclusive: d_t = 0 passes delta = 0
    # none: everything, whatever delta
    ("none", 0.0, [True, True], [[1, 1, 1], [1, 1, 0]]),
])
def test_each_gate_gives_the_hand_computed_mask_loss_and_gradient(gate, delta, rows, tokens):
    lq, lp, mask, adv, lengths = _tensors()
    dec = trust_gate(lq, lp, mask, delta, gate)
    assert dec.rows.tolist() == rows
    assert dec.tokens.int().tolist() == tokens
    out = flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=delta, gate=gate)
    loss, grad = _expected(tokens)
    assert float(out.loss.detach()) == pytest.approx(loss, rel=1e-12, abs=1e-15)
    out.loss.backward()
    torch.testing.assert_close(lq.grad, grad, rtol=1e-12, atol=1e-15)  # the NaN padding got zero gradient
    admitted_tokens = sum(map(sum, tokens))
    assert (out.stats.rows, out.stats.admitted, out.stats.admitted_tokens, out.stats.tokens) == (
        2, sum(rows), admitted_tokens, 5)
    assert out.stats.admitted_token_fraction == admitted_tokens / 5
    assert out.stats.kept_tokens == admitted_tokens
    assert out.stats.mean_d == pytest.approx((0.2332913 / 3 + 0.3347953 / 2) / 2, abs=1e-7)


def test_token_gate_numbers_written_out():
    # delta 0.01: m = [[1, 0, 1], [0, 1]]; rho = q/p = 1, 1.25 (row 0), 1 (row 1)
    # L = -(1/4) [ (0.5/3)(ln 0.5 + 1.25 ln 0.25) + (-0.5/2) ln 0.3 ] = -(1/4)(-0.404336 + 0.300993) = 0.0258357
    lq, lp, mask, adv, lengths = _tensors()
    out = flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=0.01, gate="token")
    assert float(out.loss.detach()) == pytest.approx(0.0258357, abs=1e-7)
    out.loss.backward()
    # gradient -m A rho / (B T_i): -0.5/12, 0, -0.625/12 on row 0; 0, +0.5/8 on row 1
    torch.testing.assert_close(lq.grad, torch.tensor([[-0.5 / 12, 0.0, -0.625 / 12], [0.0, 0.0625, 0.0]],
                                                     dtype=torch.float64), rtol=1e-12, atol=1e-15)


def test_token_gate_with_token_mean_and_a_precomputed_decision():
    lq, lp, mask, adv, lengths = _tensors()
    # token-mean: coefficient A_i / N with N = 10 policy tokens in the global batch
    out = flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=0.01, gate="token", total_tokens=10)
    expected = -(0.5 / 10 * (math.log(0.5) + 1.25 * math.log(0.25)) - 0.5 / 10 * math.log(0.3))
    assert float(out.loss.detach()) == pytest.approx(expected, rel=1e-12)
    # the decision from a scoring pass (admitted rows + token mask) gives the same loss
    dec = trust_gate(lq, lp, mask, 0.01, "token")
    pre = flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=0.01, gate="token", admitted=dec.rows,
                               gate_d=dec.d, token_admitted=dec.tokens)
    inline = flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=0.01, gate="token")
    assert torch.equal(pre.loss, inline.loss) and pre.stats == inline.stats
    with pytest.raises(ConfigError, match="needs token_admitted"):
        flash_reinforce_loss(lq, lp, mask, adv, lengths, B, delta=0.01, gate="token", admitted=dec.rows)
    with pytest.raises(ConfigError, match="gate must be 'sequence', 'token' or 'none', got 'tokens'"):
        flash_reinforce_loss(lq, lp, mask, adv, lengths, B, gate="tokens")


# -- the sequence gate as before, to the last bits ------------------------------------------------------
def _old_inputs(dtype):
    lq = torch.tensor([[-0.5, -1.2, -0.1, 0.0], [-2.0, -0.3, -0.7, -1.5], [-0.05, -3.0, -0.9, -0.2]], dtype=dtype)
    lp = torch.tensor([[-0.6, -1.0, -0.1, 0.0], [-1.0, -0.3, -0.9, -1.4], [-0.05, -2.5, -0.8, -0.2]], dtype=dtype)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([0.5, -0.25, -0.25], dtype=dtype)
    ent = torch.tensor([[0.3, 0.1, 0.2, 0.0], [0.5, 0.4, 0.3, 0.2], [0.0, 0.9, 0.1, 0.8]], dtype=dtype)
    return lq.requires_grad_(True), lp, mask, adv, ent


_F32_GRAD = ["-0x1.793b5p-5", "-0x1.1775c8p-5", "-0x1.555556p-5", "0x0.0p+0", "-0x0.0p+0", "-0x0.0p+0",
             "-0x0.0p+0", "-0x0.0p+0", "0x0.0p+0", "0x1.9e0eecp-7", "0x1.34d9e8p-6", "0x1.555556p-6"]
# (dtype, keyword arguments, loss, gradient, admitted, D, kept tokens, surrogate), recorded with the
# implementation before objective.gate existed (commit bf53b74)
BEFORE = {
    "f32_delta0.01": (torch.float32, dict(delta=0.01), "0x1.29c3dp-7", _F32_GRAD, [True, False, True],
                      ["0x1.749e36p-8", "0x1.80734cp-5", "0x1.1d218ap-8"], 6, "-0x1.1cb588p-4"),
    "f64_delta1": (torch.float64, dict(delta=1.0), "-0x1.554d68ccce7a6p-5",
                   ["-0x1.793b4ef22abc4p-5", "-0x1.1775c8eb9963cp-5", "-0x1.5555555555555p-5", "0x0.0p+0",
                    "0x1.78b56362cef38p-8", "0x1.0000000000000p-6", "0x1.38add9e58ac8dp-6", "0x1.cf46d99d52b3ap-7",
                    "0x0.0p+0", "0x1.9e0eea5ea1d62p-7", "0x1.34d9e668e1cd2p-6", "0x1.5555555555555p-6"],
                   [True, True, True], ["0x1.749e25ba618fdp-8", "0x1.8073496d9b417p-5", "0x1.1d21aecab5678p-8"],
                   10, "-0x1.e8af13d785fb4p-7"),
    "f32_entropy_token_mean": (torch.float32, dict(delta=1.0, entropy_keep_fraction=0.5, total_tokens=20),
                               "0x1.5fe2a8p-9",
                               ["-0x1.c4ad94p-6", "-0x1.4f5a24p-6", "-0x1.99999ap-6", "0x0.0p+0", "0x1.2d5deap-8",
                                "0x1.99999ap-7", "-0x0.0p+0", "-0x0.0p+0", "0x0.0p+0", "0x1.f0deb4p-8", "-0x0.0p+0",
                                "0x1.99999ap-7"],
                               [True, True, True], ["0x1.749e36p-8", "0x1.80734cp-5", "0x1.1d218ap-8"], 7,
                               "-0x1.263c48p-5"),
    "f32_precomputed": (torch.float32, dict(delta=1e-3, admitted=torch.tensor([True, False, True]),
                                            gate_d=torch.tensor([0.01, 0.2, 0.0])),
                        "0x1.29c3dp-7", _F32_GRAD, [True, False, True], ["0x1.47ae14p-7", "0x1.99999ap-3", "0x0.0p+0"],
                        6, "-0x1.1cb588p-4"),
}


def _assert_within_ulps(actual: list[float], expected_hex: list[str], dtype: torch.dtype, ulps: int = 64) -> None:
    """Each value within ``ulps`` times ``dtype``'s epsilon, relative, of the recorded one (an exact 0 stays 0)."""
    eps = torch.finfo(dtype).eps
    expected = [float.fromhex(x) for x in expected_hex]
    for a, e in zip(actual, expected, strict=True):
        assert abs(a - e) <= ulps * eps * abs(e), (a, e, expected_hex)


@pytest.mark.parametrize("name", list(BEFORE))
@pytest.mark.parametrize("explicit", [False, True])
def test_the_sequence_gate_is_as_before_to_the_last_bits(name, explicit):
    dtype, kw, loss, grad, admitted, d, kept, surrogate = BEFORE[name]
    lq, lp, mask, adv, ent = _old_inputs(dtype)
    kw = dict(kw, **({"entropies": ent} if "entropy_keep_fraction" in kw else {}),
              **({"gate": "sequence"} if explicit else {}))
    out = flash_reinforce_loss(lq, lp, mask, adv, mask.sum(1), 4, **kw)
    out.loss.backward()
    _assert_within_ulps([out.loss.item()], [loss], dtype)
    _assert_within_ulps(lq.grad.flatten().tolist(), grad, dtype)
    assert out.admitted.tolist() == admitted
    _assert_within_ulps(out.d.tolist(), d, dtype)
    assert out.stats.kept_tokens == kept
    _assert_within_ulps([out.stats.surrogate_sum], [surrogate], dtype)
    assert out.stats.admitted_tokens == int((mask & out.admitted.unsqueeze(1)).sum())


def test_trust_gate_sequence_is_bernoulli_kl_gate_exactly():
    lq, lp, mask, _, _ = _old_inputs(torch.float32)
    d, adm = bernoulli_kl_gate(lq, lp, mask, 0.01)
    dec = trust_gate(lq, lp, mask, 0.01, "sequence")
    assert torch.equal(dec.d, d) and torch.equal(dec.rows, adm)
    assert torch.equal(dec.tokens, mask & adm.unsqueeze(1))


# -- config, stats, learner ------------------------------------------------------------------------
def test_bad_gate_settings_are_config_errors_naming_the_field():
    with pytest.raises(ConfigError, match="objective.gate must be 'sequence', 'token' or 'none', got 'off'"):
        ObjectiveConfig(gate="off")
    with pytest.raises(ConfigError, match="objective.gate 'token' is FlashREINFORCE's trust gate; GRPO has none"):
        ObjectiveConfig(name="grpo", grpo_group_size=2, gate="token")
    assert ObjectiveConfig().gate == "sequence"


def test_admitted_token_share_adds_up_over_micro_batches():
    s = ObjectiveStats(rows=2, admitted=1, admitted_tokens=3, tokens=5) + ObjectiveStats(
        rows=2, admitted=2, admitted_tokens=4, tokens=5)
    assert (s.admitted_fraction, s.admitted_token_fraction) == (0.75, 0.7)
    assert s.to_dict()["admitted_token_fraction"] == 0.7


def _learner_grads(learner, trajs, scores):
    learner.optimizer.zero_grad(set_to_none=True)
    batch, adm = learner.prepare(trajs, scores)
    stats = learner.backward(batch, adm)
    return {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}, stats, batch


def test_learner_token_gate_from_a_scoring_pass_equals_the_inline_gate():
    model = tiny_model(3)
    learner = Learner(model, OptimConfig(),
                      objective=ObjectiveConfig(delta=3e-4, gate="token"),
                      execution=LearnerConfig(micro_batch_size=2))
    raw = make_trajectories(5, seed=3, rewards=[1, 0, 1, 0, 0])
    trajs = on_policy(raw, learner.score(raw), noise=0.3, seed=3)  # some tokens near, some far from the policy
    scores = learner.score(trajs)
    g_pre, st_pre, batch = _learner_grads(learner, trajs, scores)
    g_in, st_in, _ = _learner_grads(learner, trajs, None)
    # the scoring pass's token mask is the one the loss used, and it is a real selection
    assert 0 < st_pre.admitted_tokens < st_pre.tokens
    assert int((batch.gate_mask & batch.loss_mask).sum()) == st_pre.admitted_tokens
    assert st_in.admitted_tokens == st_pre.admitted_tokens and st_in.admitted == st_pre.admitted
    for k in g_in:
        torch.testing.assert_close(g_pre[k], g_in[k], rtol=1e-5, atol=1e-7)
    # no gate: every row and token, and the same gradient as the sequence gate admitting everything
    none = Learner(model, OptimConfig(),
                   objective=ObjectiveConfig(delta=0.0, gate="none"),
                   execution=LearnerConfig(micro_batch_size=2))
    wide = Learner(model, OptimConfig(),
                   objective=ObjectiveConfig(delta=1e9),
                   execution=LearnerConfig(micro_batch_size=2))
    g_none, st_none, _ = _learner_grads(none, trajs, None)
    g_wide, st_wide, _ = _learner_grads(wide, trajs, None)
    assert (st_none.admitted, st_none.admitted_tokens) == (5, st_none.tokens)
    assert st_none.d_sum == st_wide.d_sum > 0
    assert all(torch.equal(g_none[k], g_wide[k]) for k in g_wide)
