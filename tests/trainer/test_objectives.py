"""FlashREINFORCE and GRPO objectives against the worked vectors and the checked behaviours."""

from __future__ import annotations

import json
import math

import pytest
import torch

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.advantages import batch_mean_advantages, group_advantages
from agentenv.trainer.learners.config import ObjectiveConfig
from agentenv.trainer.objectives import ObjectiveStats, entropy_filter_mask, flash_reinforce_loss, grpo_loss
from agentenv.trainer.trust_gate import bernoulli_kl_gate


def _pad(rows, fill=0.0, dtype=torch.float64):
    t = max(len(r) for r in rows)
    out = torch.full((len(rows), t), fill, dtype=dtype)
    mask = torch.zeros(len(rows), t, dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=dtype)
        mask[i, : len(r)] = True
    return out, mask


def _case_tensors(case, fill=float("nan")):
    inp = case["inputs"]
    lp, mask = _pad([[math.log(x) for x in r] for r in inp["p_behavior"]], fill)
    lq, _ = _pad([[math.log(x) for x in r] for r in inp["q_current"]], fill)
    lq.requires_grad_(True)
    rewards = torch.tensor(inp["rewards"], dtype=torch.float64)
    return lq, lp, mask, rewards


@pytest.fixture(scope="module")
def cases(testdata_dir):
    return json.loads((testdata_dir / "flashreinforce_vectors.json").read_text())["cases"]


def test_vectors_reproduced(cases):
    assert len(cases) == 2
    for case in cases:
        exp = case["expected"]
        delta = case["inputs"]["delta"]
        lq, lp, mask, rewards = _case_tensors(case)
        adv = batch_mean_advantages(rewards)
        torch.testing.assert_close(adv, torch.tensor(exp["advantages"], dtype=torch.float64))
        lengths = mask.sum(1)
        assert lengths.tolist() == exp["lengths"]
        out = flash_reinforce_loss(lq, lp, mask, adv, lengths, len(rewards), delta=delta)
        torch.testing.assert_close(out.d, torch.tensor(exp["D"], dtype=torch.float64), rtol=1e-9, atol=1e-12)
        assert out.admitted.tolist() == exp["admitted"]
        assert out.stats.admitted_fraction == pytest.approx(exp["acceptance_rate"])
        assert float(out.loss.detach()) == pytest.approx(exp["L_ref"], rel=1e-12)
        assert out.stats.surrogate_sum == pytest.approx(exp["L_surr"], rel=1e-12)
        out.loss.backward()
        g, _ = _pad(exp["grad_wrt_logq"], 0.0)
        torch.testing.assert_close(lq.grad, g, rtol=1e-12, atol=1e-15)  # NaN padding got zero gradient


def test_vectors_float32(cases):
    for case in cases:
        lq, lp, mask, rewards = _case_tensors(case)
        lq32 = lq.detach().float().requires_grad_(True)
        out = flash_reinforce_loss(
            lq32, lp.float(), mask, batch_mean_advantages(rewards.float()), mask.sum(1), len(rewards),
            delta=case["inputs"]["delta"],
        )
        assert out.loss.dtype == torch.float32
        assert float(out.loss.detach()) == pytest.approx(case["expected"]["L_ref"], rel=1e-5)


def test_bf16_promoted_before_gate(cases):
    case = cases[1]
    lq, lp, mask, rewards = _case_tensors(case, fill=0.0)
    lqb = lq.detach().bfloat16().requires_grad_(True)
    out = flash_reinforce_loss(
        lqb, lp.bfloat16(), mask, batch_mean_advantages(rewards), mask.sum(1), 3, delta=0.005
    )
    assert out.loss.dtype == torch.float32
    assert out.d.dtype == torch.float32
    # gate from bf16-rounded probabilities still matches the float64 decision
    assert out.admitted.tolist() == case["expected"]["admitted"]
    out.loss.backward()
    assert lqb.grad.dtype == torch.bfloat16 and torch.isfinite(lqb.grad.float()).all()


def test_zero_gradient_equal_rewards_or_all_rejected(cases):
    lq, lp, mask, _ = _case_tensors(cases[1])
    adv = batch_mean_advantages(torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64))
    out = flash_reinforce_loss(lq, lp, mask, adv, mask.sum(1), 3, delta=0.005)
    out.loss.backward()
    assert torch.equal(lq.grad, torch.zeros_like(lq)) and float(out.loss.detach()) == 0.0
    lq.grad = None
    adv = batch_mean_advantages(torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    out = flash_reinforce_loss(lq, lp, mask, adv, mask.sum(1), 3, delta=0.0)  # only exact matches pass
    assert not out.admitted.any()
    out.loss.backward()
    assert torch.equal(lq.grad, torch.zeros_like(lq))


def test_masked_nan_inf_never_reach_loss_or_grad():
    lq = torch.tensor([[-0.5, -1.0, float("nan"), float("inf")], [-0.2, float("-inf"), float("nan"), 3.0]],
                      requires_grad=True)
    lp = torch.tensor([[-0.6, -1.1, float("inf"), float("nan")], [-0.2, float("nan"), 7.0, float("-inf")]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    for fn in (
        lambda: flash_reinforce_loss(lq, lp, mask, torch.tensor([0.5, -0.5]), mask.sum(1), 2, delta=1.0),
        lambda: grpo_loss(lq, lp, mask, torch.tensor([0.5, -0.5]), mask.sum(1), 3),
    ):
        lq.grad = None
        out = fn()
        assert torch.isfinite(out.loss)
        out.loss.backward()
        assert torch.isfinite(lq.grad).all()
        assert torch.equal(lq.grad[~mask], torch.zeros(int((~mask).sum())))
        assert (lq.grad[mask] != 0).all()


def test_row_total_gradient_independent_of_length():
    # rho = 1 (on-policy): a row's summed gradient is -A_i/B whatever T_i
    rows = [[-0.3], [-0.3] * 7, [-0.1] * 50]
    lq, mask = _pad(rows)
    lq.requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, -2.0], dtype=torch.float64)
    out = flash_reinforce_loss(lq, lq.detach().clone(), mask, adv, mask.sum(1), 3, delta=0.0)
    out.loss.backward()
    torch.testing.assert_close(lq.grad.sum(1), -adv / 3)


@pytest.mark.parametrize("options", [{}, {"loss_constant": 7}, {"is_truncation": 1.05},
                                     {"loss_constant": 7, "is_truncation": 1.05}])
def test_microbatch_partial_sums_add_up(cases, options):
    case = cases[1]
    lq, lp, mask, rewards = _case_tensors(case)
    adv = batch_mean_advantages(rewards)
    full = flash_reinforce_loss(lq, lp, mask, adv, mask.sum(1), 3, delta=0.005, **options)
    full.loss.backward()
    g_full = lq.grad.clone()
    lq.grad = None
    stats = ObjectiveStats()
    total = 0.0
    for sl in (slice(0, 1), slice(1, 3)):
        out = flash_reinforce_loss(lq[sl], lp[sl], mask[sl], adv[sl], mask[sl].sum(1), 3, delta=0.005, **options)
        out.loss.backward()
        stats = stats + out.stats
        total += float(out.loss.detach())
    assert total == pytest.approx(float(full.loss.detach()), rel=1e-12)
    torch.testing.assert_close(lq.grad, g_full)
    assert stats.admitted == 2 and stats.rows == 3 and stats.tokens == 9
    assert stats.mean_d == pytest.approx(full.stats.mean_d)


def test_errors():
    lq = torch.tensor([[-0.5, -1.0], [-0.2, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    adv = torch.tensor([0.5, -0.5])
    ok = dict(advantages=adv, lengths=mask.sum(1), batch_size=2)
    with pytest.raises(ValueError, match="empty row"):
        m2 = mask.clone()
        m2[1] = False
        flash_reinforce_loss(lq, lq, m2, adv, m2.sum(1), 2)
    bad = lq.clone()
    bad[1, 0] = float("nan")
    with pytest.raises(ValueError, match=r"trajectory abc \(row 1\).*non-finite"):
        flash_reinforce_loss(bad, lq, mask, row_ids=["x", "abc"], **ok)
    with pytest.raises(ValueError, match="non-finite behaviour"):
        flash_reinforce_loss(lq, bad, mask, **ok)
    pos = lq.clone()
    pos[0, 1] = 0.3
    with pytest.raises(ValueError, match="positive current log-probability"):
        flash_reinforce_loss(pos, lq, mask, **ok)
    with pytest.raises(ValueError, match="delta"):
        flash_reinforce_loss(lq, lq, mask, delta=-1e-3, **ok)
    with pytest.raises(ValueError, match="delta"):
        ObjectiveConfig(delta=-0.1)
    for q in (-0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            flash_reinforce_loss(lq, lq, mask, entropies=torch.zeros(2, 2), entropy_keep_fraction=q, **ok)
        with pytest.raises(ValueError, match="fraction"):
            ObjectiveConfig(entropy_keep_fraction=q)
    with pytest.raises(ValueError, match="T_i=2"):
        flash_reinforce_loss(lq, lq, mask, adv, torch.tensor([2, 2]), 2)
    with pytest.raises(ValueError, match="batch_size"):
        flash_reinforce_loss(lq, lq, mask, adv, mask.sum(1), 1)
    with pytest.raises(DataError, match="empty batch"):
        batch_mean_advantages(torch.tensor([]))


def test_entropy_filter():
    ent = torch.tensor([[0.1, 0.9, 0.5, 0.7, float("nan")], [0.3, 0.2, 0.1, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    rows = torch.tensor([True, False])
    keep = entropy_filter_mask(ent, mask, rows, 0.5)  # ceil(0.5*4)=2 highest: positions 1, 3
    assert keep.tolist() == [[False, True, False, True, False], [True, True, True, False, False]]
    assert entropy_filter_mask(ent, mask, rows, 0.7)[0].sum() == 3  # ceil(2.8)=3
    assert entropy_filter_mask(ent, mask, rows, 0.75)[0].sum() == 3  # exactly 3, no float overshoot
    assert entropy_filter_mask(ent, mask, rows, 0.0)[0].sum() == 0
    assert torch.equal(entropy_filter_mask(ent, mask, rows, 1.0), mask)
    # in the loss: the filtered failed row keeps its denominator T_i = 4
    lq = torch.full((2, 5), -0.5, requires_grad=True)
    adv = torch.tensor([-1.0, 1.0])
    out = flash_reinforce_loss(lq, lq.detach(), mask, adv, mask.sum(1), 2, delta=0.0,
                               entropies=ent, entropy_keep_fraction=0.5)
    out.loss.backward()
    expected = torch.zeros(2, 5)
    expected[0, 1] = expected[0, 3] = 1.0 / (2 * 4)
    expected[1, :3] = -1.0 / (2 * 3)
    torch.testing.assert_close(lq.grad, expected)
    assert out.stats.kept_tokens == 5


def test_group_advantages_and_config():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    a = group_advantages(r, 4)
    # group 1: mean .25, unbiased std 0.5 -> (0.75/0.5, -0.25/0.5, ...)
    torch.testing.assert_close(a[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]), rtol=1e-5, atol=1e-5)
    assert torch.equal(a[4:], torch.zeros(4))
    with pytest.raises(ConfigError, match="n = 1"):
        group_advantages(r, 1)
    with pytest.raises(ConfigError, match="grpo_group_size >= 2"):
        ObjectiveConfig(name="grpo", grpo_group_size=1)
    with pytest.raises(DataError, match="whole number"):
        group_advantages(r[:7], 4)


def test_grpo_clip_hand_computed():
    # one row A=+1 with ratios 1.5 (clipped at 1.2) and 0.5 (unclipped, min picks 0.5);
    # one row A=-1 with ratio 0.5 (clipped at 0.8 -> -0.8 is min) and 1.0.
    lp = torch.log(torch.tensor([[0.4, 0.4], [0.4, 0.4]]))
    lq = torch.log(torch.tensor([[0.6, 0.2], [0.2, 0.4]])).requires_grad_(True)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    out = grpo_loss(lq, lp, mask, adv, mask.sum(1), total_tokens=4, clip_eps=0.2)
    # L = -(1/4)(1.2 + 0.5 - 0.8 - 1.0) = 0.025
    assert float(out.loss.detach()) == pytest.approx(0.025, rel=1e-5)
    out.loss.backward()
    # d/dlogq of r*A/4 for unclipped tokens = -(r A)/4; clipped -> 0
    torch.testing.assert_close(lq.grad, torch.tensor([[0.0, -0.125], [0.0, 0.25]]), rtol=1e-5, atol=1e-6)
    assert out.stats.clipped_tokens == 2


def test_gate_inclusive_threshold():
    lp = torch.log(torch.tensor([[0.5, 0.8]], dtype=torch.float64))
    lq = torch.log(torch.tensor([[0.52, 0.78]], dtype=torch.float64))
    d, adm = bernoulli_kl_gate(lq, lp, torch.ones(1, 2, dtype=torch.bool), 1.0)
    _, adm_eq = bernoulli_kl_gate(lq, lp, torch.ones(1, 2, dtype=torch.bool), float(d[0]))
    _, adm_below = bernoulli_kl_gate(lq, lp, torch.ones(1, 2, dtype=torch.bool), float(d[0]) * (1 - 1e-9))
    assert adm_eq.item() and not adm_below.item()
