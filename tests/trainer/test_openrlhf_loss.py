"""Cross-check of OUR FlashREINFORCE objective against OpenRLHF 0.11.2's ``PolicyLoss`` configured as
FlashREINFORCE (``policy_loss_type="ppo"``, ``is_correction_level="seq"``, ``is_correction_gating=
"binary_kl"``, ``is_correction_mode="mask"``, threshold ``(0, delta)``, ``loss_agg_mode="seq-mean"``
i.e. ``token_level_loss=False``, ``global_batch_size=B``), one optimizer step per batch so
``old_log_probs = log_probs.detach()`` (the PPO ratio is 1 and never clipped).

Equal gradients on ordinary inputs; the exact known differences are asserted:

* OpenRLHF divides a row's sum by ``T_i + 1e-8`` (relative 1e-8/T_i: inside the tolerance);
* OpenRLHF does not clamp the log importance ratio; we clamp it to [-30, 30] (docs/algorithms.md);
* OpenRLHF's default token-level aggregation (``token-mean``) weighs row i by ``B * T_i / N``
  relative to the sample mean;
* OpenRLHF's ``dp_size`` factor is the same compensation for DeepSpeed's rank averaging that our
  backend applies as ``gas * dp`` at ``backward``.

Budget: under 1 s after imports (pure tensors, no DeepSpeed engine).
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed: run scripts/install_openrlhf.sh")
pytest.importorskip("openrlhf", reason="needs openrlhf: run scripts/install_openrlhf.sh")

from agentenv.errors import ConfigError  # noqa: E402
from agentenv.trainer.advantages import batch_mean_advantages
from agentenv.trainer.learners.openrlhf_compat import flash_attn_is_stubbed, import_openrlhf  # noqa: E402
from agentenv.trainer.objectives import flash_reinforce_loss  # noqa: E402

pytestmark = pytest.mark.openrlhf

DELTA = 2e-3


@pytest.fixture(scope="module")
def orl():
    return import_openrlhf()


def _policy_loss(orl, delta=DELTA, token_level=False):
    return orl.PolicyLoss(
        clip_eps_low=0.2,
        clip_eps_high=0.2,
        token_level_loss=token_level,
        policy_loss_type="ppo",
        is_correction_level="seq",
        is_correction_mode="mask",
        is_correction_gating="binary_kl",
        is_correction_threshold=(0.0, delta),
    )


def _inputs(seed=0, b=6, t=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 4, 7, 1, 5, 8])[:b]
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    cur = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3 - 0.05
    # behaviour = current + small noise (admitted) except rows 2 and 4 (far: rejected by the gate)
    noise = torch.randn(b, t, generator=g, dtype=torch.float64) * 0.03
    noise[2] *= 40
    noise[4] *= 40
    beh = (cur + noise).clamp_max(-1e-4)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0])[:b]
    return cur, beh, mask, lengths, rewards


def _ours(cur, beh, mask, lengths, rewards, delta=DELTA):
    x = cur.clone().requires_grad_(True)
    adv = batch_mean_advantages(rewards)
    out = flash_reinforce_loss(x, beh, mask, adv, lengths, len(rewards), delta=delta)
    out.loss.backward()
    return x.grad, out


def _theirs(orl, cur, beh, mask, lengths, rewards, delta=DELTA, token_level=False, dp_size=1, rows=None):
    x = cur.clone().requires_grad_(True)
    adv = batch_mean_advantages(rewards).to(cur.dtype)
    sel = slice(None) if rows is None else rows
    advantages = adv[sel].unsqueeze(1).expand_as(cur[sel]) * mask[sel]
    loss, _clip, _kl, _vllm_kl, filtered = _policy_loss(orl, delta, token_level)(
        x[sel],
        x[sel].detach(),
        advantages,
        action_mask=mask[sel].to(cur.dtype),
        rollout_log_probs=beh[sel],
        dp_size=dp_size,
        batch_num_tokens=float(mask.sum()),
        global_batch_size=float(len(rewards)),
    )
    loss.backward()
    return x.grad, loss, filtered


def test_openrlhf_imports_without_flash_attn(orl):
    import sys

    assert orl.version == "0.11.2"
    if flash_attn_is_stubbed():
        # the stand-in is gone from sys.modules again; OpenRLHF's bound names raise a clear error
        assert "flash_attn" not in sys.modules
        from openrlhf.models import ring_attn_utils

        with pytest.raises(ConfigError, match="flash-attn is not installed"):
            ring_attn_utils.pad_input(None, None, 1, 1)
        from transformers.utils import is_flash_attn_2_available

        assert not is_flash_attn_2_available()


def test_equal_gradients_and_gate_decisions(orl):
    cur, beh, mask, lengths, rewards = _inputs()
    g_ours, out = _ours(cur, beh, mask, lengths, rewards)
    g_theirs, loss_theirs, filtered = _theirs(orl, cur, beh, mask, lengths, rewards)
    assert out.admitted.tolist() == [True, True, False, True, False, True]  # both far rows rejected
    assert float(filtered) == pytest.approx(2 / 6)  # OpenRLHF's filter fraction agrees
    assert g_ours.abs().max() > 1e-3
    # only denominators T_i vs T_i + 1e-8 differ
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-7, atol=1e-12)
    # at ratio 1 the PPO surrogate equals our importance-weighted surrogate (not our loss value); the
    # rows' terms (~0.5 each) cancel to ~3e-3, so the 1e-8/T_i denominator difference shows at ~1e-9 abs
    assert float(loss_theirs.detach()) == pytest.approx(out.stats.surrogate_sum, abs=1e-8)


def test_data_parallel_shards_sum_to_the_full_gradient_with_dp_size(orl):
    """OpenRLHF's per-rank loss carries * dp_size (DeepSpeed averages ranks): mean of ranks = full."""
    cur, beh, mask, lengths, rewards = _inputs(seed=1)
    g_full, _ = _ours(cur, beh, mask, lengths, rewards)
    g0, _, _ = _theirs(orl, cur, beh, mask, lengths, rewards, dp_size=2, rows=slice(0, 3))
    g1, _, _ = _theirs(orl, cur, beh, mask, lengths, rewards, dp_size=2, rows=slice(3, 6))
    torch.testing.assert_close((g0 + g1) / 2, g_full, rtol=1e-7, atol=1e-12)


def test_known_difference_log_ratio_clamp(orl):
    """A token with log q - log p = 35: we use exp(30), OpenRLHF exp(35) (huge delta admits the row)."""
    cur, beh, mask, lengths, rewards = _inputs(seed=2)
    cur[0, 0], beh[0, 0] = -0.5, -35.5
    g_ours, _ = _ours(cur, beh, mask, lengths, rewards, delta=1e9)
    g_theirs, _, _ = _theirs(orl, cur, beh, mask, lengths, rewards, delta=1e9)
    assert float(g_theirs[0, 0] / g_ours[0, 0]) == pytest.approx(math.exp(5.0), rel=1e-8)  # T vs T+1e-8
    other = torch.ones_like(mask)
    other[0, 0] = False
    torch.testing.assert_close(g_ours[other], g_theirs[other], rtol=1e-7, atol=1e-12)


def test_known_difference_token_mean_aggregation(orl):
    """OpenRLHF's default token-mean gives row i the weight B * T_i / N relative to our sample mean."""
    cur, beh, mask, lengths, rewards = _inputs(seed=3)
    g_ours, _ = _ours(cur, beh, mask, lengths, rewards)
    g_tok, _, _ = _theirs(orl, cur, beh, mask, lengths, rewards, token_level=True)
    b, n = len(rewards), float(mask.sum())
    factor = (b * lengths.double() / n).unsqueeze(1)
    torch.testing.assert_close(g_tok, g_ours * factor, rtol=1e-7, atol=1e-12)
    # and a row's total gradient then grows with its length, which ours does not (docs/algorithms.md)
    assert not torch.allclose(g_tok, g_ours)


def test_zero_gradient_when_all_rewards_equal_in_both(orl):
    cur, beh, mask, lengths, _ = _inputs(seed=4)
    rewards = torch.ones(6)
    g_ours, _ = _ours(cur, beh, mask, lengths, rewards)
    g_theirs, _, _ = _theirs(orl, cur, beh, mask, lengths, rewards)
    assert float(g_ours.abs().max()) == 0.0 and float(g_theirs.abs().max()) == 0.0
