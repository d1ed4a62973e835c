"""Log-probabilities in token chunks: the single pass's values and gradient, without its logits kept."""

from __future__ import annotations

import pytest
import torch

from agentenv.engines.sampling import SamplingTransform, label_logprobs
from agentenv.errors import ConfigError
from agentenv.trainer.learners.config import LearnerConfig
from agentenv.trainer.learners.forward import token_logprobs
from agentenv.trainer.learners.logprob_chunks import chunked_label_logprobs, split_head

from .conftest import make_trajectories, tiny_model

TRANSFORMS = [
    SamplingTransform(),
    SamplingTransform(temperature=0.7),
    SamplingTransform(temperature=1.3, top_p=0.8),
    SamplingTransform(temperature=0.9, top_k=5),
    SamplingTransform(temperature=0.8, top_p=0.9, top_k=7),
]


def _head_and_inputs(seed: int, b: int = 3, k: int = 11, width: int = 8, vocab: int = 23):
    g = torch.Generator().manual_seed(seed)
    head = torch.nn.Linear(width, vocab, bias=False).double()
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, width, generator=g, dtype=torch.float64))
    hidden = torch.randn(b, k, width, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, vocab, (b, k), generator=g)
    return head, hidden, labels


@pytest.mark.parametrize("transform", TRANSFORMS, ids=repr)
@pytest.mark.parametrize("chunk", [1, 4, 33, 1000])
def test_chunks_give_the_single_pass_values_entropy_and_gradient(transform, chunk):
    head, hidden, labels = _head_and_inputs(1)
    weights = torch.randn(labels.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)

    lp_ref, ent_ref = label_logprobs(head(hidden), labels, transform, with_entropy=True)
    (lp_ref.double() * weights).sum().backward()
    g_hidden, g_head = hidden.grad.clone(), head.weight.grad.clone()
    hidden.grad, head.weight.grad = None, None

    lp, ent = chunked_label_logprobs(hidden, head, labels, transform, chunk, with_entropy=True)
    (lp.double() * weights).sum().backward()
    assert lp.shape == labels.shape and ent.shape == labels.shape
    torch.testing.assert_close(lp, lp_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(hidden.grad, g_hidden, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(head.weight.grad, g_head, rtol=1e-6, atol=1e-9)
    if transform.truncates:  # the kept set matters: the truncated values differ from plain log-softmax
        plain = torch.log_softmax(head(hidden).float() / transform.temperature, -1).gather(2, labels[..., None])[..., 0]
        assert (lp - plain).abs().max() > 1e-3


def test_no_tokens_by_vocabulary_tensor_is_kept_for_backward():
    """The forward keeps no logits for backward (each chunk's are recomputed from its hidden states)."""
    head, hidden, labels = _head_and_inputs(3, b=4, k=50, vocab=97)
    saved: list[tuple[int, ...]] = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    for chunk, expect_most in ((16, 0), (None, 200)):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if chunk is None:
                lp, _ = label_logprobs(head(hidden), labels, SamplingTransform(top_p=0.9))
            else:
                lp, _ = chunked_label_logprobs(hidden, head, labels, SamplingTransform(top_p=0.9), chunk)
        vocab_rows = [s[0] if len(s) == 2 else s[0] * s[1] for s in saved if s and s[-1] == 97]
        assert max(vocab_rows, default=0) == expect_most, saved
        if chunk is not None:  # what it keeps instead: each chunk's (chunk, H) hidden states and labels
            assert saved and max(s[0] for s in saved) == chunk
        lp.sum().backward()


def test_token_logprobs_chunks_through_the_model_head():
    """A transformers LM is scored from its decoder's hidden states: same values, gradient at every weight."""
    model = tiny_model(31).double()
    from agentenv.trainer.batching import build_batch

    batch = build_batch(make_trajectories(4, seed=31), 0)
    t = SamplingTransform(temperature=0.8, top_p=0.9)
    lp_ref, _ = token_logprobs(model, batch, sampling=t, chunk_tokens=None)
    (lp_ref * batch.loss_mask).sum().backward()
    ref = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    lp, _ = token_logprobs(model, batch, sampling=t, chunk_tokens=3)
    (lp * batch.loss_mask).sum().backward()
    m = batch.loss_mask
    torch.testing.assert_close(lp[m], lp_ref[m], rtol=1e-6, atol=1e-9)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, ref[name], rtol=1e-6, atol=1e-10, msg=name)


def test_split_head_only_for_plain_heads():
    model = tiny_model(32)
    decoder, head = split_head(model)
    assert decoder is model.model and head is model.lm_head
    assert split_head(torch.nn.Linear(2, 2)) is None
    model.config.final_logit_softcapping = 30.0  # logits = cap * tanh(logits / cap): not lm_head(hidden)
    assert split_head(model) is None


def test_bad_chunk_sizes_are_refused():
    head, hidden, labels = _head_and_inputs(4)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_label_logprobs(hidden, head, labels, None, 0)
    for bad in (0, -5):
        with pytest.raises(ConfigError, match="logprob_chunk_tokens must be >= 1"):
            LearnerConfig(logprob_chunk_tokens=bad)
        with pytest.raises(ConfigError, match="max_tokens_per_micro_batch must be >= 1"):
            LearnerConfig(max_tokens_per_micro_batch=bad)
