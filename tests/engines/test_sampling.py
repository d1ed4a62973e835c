"""processed_logprobs and sample on hand-computed vectors."""

from __future__ import annotations

import math

import pytest
import torch

from agentenv.engines.base import SamplingParams
from agentenv.engines.sampling import processed_logprobs, sample, validate_params
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
