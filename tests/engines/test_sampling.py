"""processed_logprobs, sample and the learner's SamplingTransform on hand-computed vectors."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.engines.base import SamplingParams
from agentenv.engines.sampling import (
    SamplingTransform,
    label_logprobs,
    processed_logprobs,
    sample,
    validate_params,
)
from agentenv.errors import ConfigError


def test_top_p_keeps_the_smallest_nucleus_and_renormalises():
    logits = torch.tensor([[math.log(0.5), math.log(0.3), math.log(0.2)]])
    lp = processed_logprobs(logits, torch.tensor([1.0]), torch.tensor([0.6]))
    # 0.5 alone < 0.6, so 0.3 joins; 0.2 is dropped: (0.625, 0.375, 0)
    torch.testing.assert_close(lp.exp(), torch.tensor([[0.625, 0.375, 0.0]]))
    lp = processed_logprobs(logits, torch.tensor([1.0]), torch.tensor([0.5]))
    torch.testing.assert_close(lp.exp(), torch.tensor([[1.0, 0.0, 0.0]]))  # 0.5 already reaches 0.5
    lp = processed_logprobs(logits, torch.tensor([1.0]), torch.tensor([1.0]))
    torch.testing.assert_close(lp.exp(), torch.tensor([[0.5, 0.3, 0.2]]))


def test_temperature_scales_logits_per_row():
    logits = torch.tensor([[0.0, math.log(4.0)], [0.0, math.log(4.0)]])
    lp = processed_logprobs(logits, torch.tensor([2.0, 1.0]), torch.tensor([1.0, 1.0]))
    # T=2: weights 1 : 2 -> (1/3, 2/3); T=1: 1 : 4 -> (0.2, 0.8)
    torch.testing.assert_close(lp.exp(), torch.tensor([[1 / 3, 2 / 3], [0.2, 0.8]]))


def test_sample_is_reproducible_per_row_and_greedy_reports_zero():
    lp = torch.log_softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    g = [torch.Generator().manual_seed(5), None, torch.Generator().manual_seed(9)]
    ids, lps = sample(lp, [False, True, False], g)
    assert ids[1] == int(lp[1].argmax()) and lps[1] == 0.0
    ids2, _ = sample(lp[[2]], [False], [torch.Generator().manual_seed(9)])
    assert ids2[0] == ids[2]  # row 2's draw does not depend on the other rows
    assert lps[0] == pytest.approx(float(lp[0, ids[0]]))


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=-1),
        SamplingParams(temperature=-0.1),
        SamplingParams(top_p=1.5),
        SamplingParams(top_p=0.0),
        SamplingParams(stop_token_ids=(-1,)),
        SamplingParams(temperature=float("nan")),
    ],
)
def test_bad_params_are_config_errors(params):
    with pytest.raises(ConfigError):
        validate_params(params)


# -- top-k and the learner's SamplingTransform ------------------------------------------------------
P5 = [0.4, 0.3, 0.15, 0.1, 0.05]


def _logits5() -> torch.Tensor:
    return torch.tensor([math.log(p) for p in P5])


def test_top_k_keeps_the_k_largest_then_top_p_works_on_the_renormalised_rest():
    x = _logits5()[None]
    one, off = torch.tensor([1.0]), torch.tensor([1.0])
    lp = processed_logprobs(x, one, off, torch.tensor([2]))
    torch.testing.assert_close(lp.exp(), torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0, 0.0]]))
    # top_p 0.75 alone keeps {0.4, 0.3, 0.15} (the two smallest hold 0.15 <= 0.25) ...
    lp = processed_logprobs(x, one, torch.tensor([0.75]), torch.tensor([0]))
    torch.testing.assert_close(lp.exp(), torch.tensor([[0.4, 0.3, 0.15, 0.0, 0.0]]) / 0.85)
    # ... but after top-k 3 the 0.15 holds 0.15 / 0.85 = 0.176 <= 0.25 of the renormalised mass: dropped
    lp = processed_logprobs(x, one, torch.tensor([0.75]), torch.tensor([3]))
    torch.testing.assert_close(lp.exp(), torch.tensor([[4 / 7, 3 / 7, 0.0, 0.0, 0.0]]))
    # k >= V and k = 0 are off; ties at the k-th logit are kept
    torch.testing.assert_close(processed_logprobs(x, one, off, torch.tensor([9])), x.log_softmax(-1))
    tie = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    assert torch.isfinite(processed_logprobs(tie, one, off, torch.tensor([2]))).sum() == 3


def test_transform_log_probs_and_gradients_by_hand():
    # T = 0.5 squares the probabilities: (0.16, 0.09, 0.0225, 0.01, 0.0025) / 0.285; top_p 0.8 drops the
    # three smallest (cumulative 0.123 <= 0.2), leaving (0.16, 0.09) / 0.25 = (0.64, 0.36).
    x = _logits5().repeat(1, 2, 1).requires_grad_(True)  # (b=1, k=2, V=5)
    labels = torch.tensor([[1, 0]])
    tr = SamplingTransform(temperature=0.5, top_p=0.8)
    lp, ent = label_logprobs(x, labels, tr, with_entropy=True)
    torch.testing.assert_close(lp, torch.tensor([[math.log(0.36), math.log(0.64)]]))
    torch.testing.assert_close(ent, torch.full((1, 2), -(0.64 * math.log(0.64) + 0.36 * math.log(0.36))))
    lp.sum().backward()
    # d log pi(l) / d x_j = (1[j = l] - pi_j) / T on the kept set, 0 on the dropped tokens
    want = torch.tensor([[[-1.28, 1.28, 0.0, 0.0, 0.0], [0.72, -0.72, 0.0, 0.0, 0.0]]])
    torch.testing.assert_close(x.grad, want)


def test_transform_top_k_case_and_a_label_outside_the_kept_set():
    x = _logits5().repeat(1, 2, 1).requires_grad_(True)
    tr = SamplingTransform(temperature=1.0, top_p=0.75, top_k=3)  # keeps {0.4, 0.3}: (4/7, 3/7)
    lp, _ = label_logprobs(x, torch.tensor([[0, 2]]), tr)
    # label 2 lies outside the kept set: it is counted in it, so log pi = log(0.15 / 0.85), finite
    torch.testing.assert_close(lp, torch.tensor([[math.log(4 / 7), math.log(0.15 / 0.85)]]))
    lp.sum().backward()
    want = torch.tensor([[[3 / 7, -3 / 7, 0.0, 0.0, 0.0], [-0.4 / 0.85, -0.3 / 0.85, 0.7 / 0.85, 0.0, 0.0]]])
    torch.testing.assert_close(x.grad, want)


def test_identity_transform_is_plain_log_softmax_and_matches_the_engine_rule():
    g = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(2, 6, 40, generator=g)
    labels = torch.randint(0, 40, (2, 6), generator=g)
    lp, ent = label_logprobs(x, labels, with_entropy=True)
    logp = x.log_softmax(-1)
    torch.testing.assert_close(lp, logp.gather(2, labels[..., None])[..., 0], rtol=0, atol=0)
    torch.testing.assert_close(ent, -(logp.exp() * logp).sum(-1))
    for tr in [SamplingTransform(0.6, 0.9), SamplingTransform(0.7, 1.0, 5), SamplingTransform(1.3, 0.5, 12)]:
        flat = x.reshape(12, 40)
        eng = processed_logprobs(
            flat, torch.full((12,), tr.temperature), torch.full((12,), tr.top_p), torch.full((12,), tr.top_k or 0)
        ).view(2, 6, 40)
        top = eng.argmax(-1)  # always kept: both sides must agree exactly
        lp, _ = label_logprobs(x, top, tr)
        torch.testing.assert_close(lp, eng.gather(2, top[..., None])[..., 0], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": -0.6},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"top_p": 0.0},
        {"top_p": 1.01},
        {"top_k": -1},
        {"top_k": 2.5},
        {"top_k": True},
    ],
)
def test_bad_transforms_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        SamplingTransform(**kwargs)


def test_top_k_validation_of_requests():
    with pytest.raises(ConfigError, match="top_k"):
        validate_params(SamplingParams(top_k=-1))
    validate_params(SamplingParams(top_k=0))
    validate_params(SamplingParams(top_k=None))
    validate_params(SamplingParams(top_k=5))


def test_chunked_sort_gives_the_same_values(monkeypatch):
    import agentenv.engines.sampling as sampling

    g = torch.Generator().manual_seed(1)
    x = 2 * torch.randn(3, 5, 64, generator=g)
    labels = torch.randint(0, 64, (3, 5), generator=g)
    tr = SamplingTransform(0.6, 0.9, 10)
    whole, _ = label_logprobs(x, labels, tr)
    monkeypatch.setattr(sampling, "_SORT_CHUNK_ELEMENTS", 64 * 2)  # two rows per chunk
    chunked, _ = label_logprobs(x, labels, tr)
    torch.testing.assert_close(chunked, whole, rtol=0, atol=0)
