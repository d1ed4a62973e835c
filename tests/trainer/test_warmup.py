"""The supervised tool-use warm-up: its gradient, its stop flag."""

from __future__ import annotations

import random

import pytest
import torch

from agentenv.errors import Interrupted
from agentenv.trainer.warmup import WarmupConfig, sft_warmup

from .conftest import VOCAB, tiny_model


def _examples(n: int, seed: int, system: int = 0) -> list[tuple[list[int], list[bool]]]:
    """``n`` transcripts; with ``system`` > 0 they all start with the same ``system`` prompt tokens."""
    rng = random.Random(seed)
    prompt = [rng.randrange(1, VOCAB) for _ in range(system)]
    out = []
    for _ in range(n):
        length = rng.randint(6, 14)
        ids = prompt + [rng.randrange(1, VOCAB) for _ in range(length)]
        mask = [False] * (system + 3) + [rng.random() < 0.6 for _ in range(length - 3)]
        mask[-1] = True
        out.append((ids, mask))
    return out


def _padded_token_mean_nll(model, batch) -> torch.Tensor:
    """The reference loss: a right-padded batch, full logits, mean NLL over every masked token."""
    width = max(len(x) for x, _ in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.bool)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    for i, (x, m) in enumerate(batch):
        ids[i, : len(x)], mask[i, : len(m)], attn[i, : len(x)] = torch.tensor(x), torch.tensor(m), 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return nll[mask[:, 1:]].mean()


@pytest.mark.parametrize("system", [0, 20])  # 20: the shared-prefix pass of token_logprobs
def test_one_step_equals_an_adamw_step_on_the_padded_batch_loss(system):
    examples = _examples(3, seed=1, system=system)
    cfg = WarmupConfig(steps=1, batch_size=3, lr=1e-2)
    ours, ref = tiny_model(21), tiny_model(21)
    # the warm-up draws the batch from a shuffled order; with batch = all examples it is a permutation
    losses = sft_warmup(ours, examples, cfg)
    ref.train()
    loss = _padded_token_mean_nll(ref, examples)
    assert losses[0] == pytest.approx(loss.item(), rel=1e-5)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
    opt.step()
    for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
        # AdamW's first step is lr * sign(g): where |g| is at rounding level (a few entries once the
        # prefix pass reorders the sums) the sign is arbitrary, so those entries are not compared
        sure = q.grad.abs() > 1e-6
        torch.testing.assert_close(p[sure], q[sure], rtol=1e-4, atol=1e-6, msg=name)


def test_loss_falls_on_a_repeated_transcript():
    losses = sft_warmup(tiny_model(22), _examples(1, seed=2), WarmupConfig(steps=15, batch_size=1, lr=1e-2))
    assert losses[-1] < 0.5 * losses[0]


def test_should_stop_interrupts_between_steps():
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 2

    with pytest.raises(Interrupted, match="after 2 of 10 steps"):
        sft_warmup(tiny_model(23), _examples(2, seed=3), WarmupConfig(steps=10, batch_size=1), should_stop=should_stop)
