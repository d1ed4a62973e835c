"""Reference computations and model wrappers for the engine tests."""

from __future__ import annotations

import functools
import inspect
import threading

import torch
from transformers import DynamicCache

from agentenv.engines.base import TokenSpan


def reference_processed(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Independent top-p: keep token i iff the mass of strictly more likely tokens is < top_p."""
    x = logits.double() / temperature
    probs = x.softmax(-1)
    sorted_p, order = probs.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p
    keep_sorted = before < top_p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return (kept / kept.sum(-1, keepdim=True)).log()


@torch.no_grad()
def full_forward_logprobs(model, prompt, tokens, temperature=1.0, top_p=1.0) -> torch.Tensor:
    """Log-probs of ``tokens`` after ``prompt`` from one full forward pass of ``model``."""
    ids = torch.tensor([list(prompt) + list(tokens)])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    lp = reference_processed(logits, temperature, top_p)
    return lp.gather(1, torch.tensor(tokens)[:, None])[:, 0].float()


@torch.no_grad()
def keep_mode_logprobs(
    models, prompt, tokens, spans: list[TokenSpan], temperature=1.0, top_p=1.0
) -> torch.Tensor:
    """Log-probs when span k's tokens are predicted by ``models[k]`` on a KV cache that earlier
    models computed (the input position predicting token j is processed by the model of token j)."""
    seq = list(prompt) + list(tokens)
    cache = DynamicCache(config=models[0].config)
    out, start_in = [], 0
    done = 0
    for model, span in zip(models, spans, strict=True):
        end_in = (
            len(prompt) + done + span.num_tokens - 2
        )  # inputs [start_in, end_in]: the last n predict this span
        ids = torch.tensor([seq[start_in : end_in + 1]])
        pos = torch.arange(start_in, end_in + 1)[None]
        kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        logits = model(input_ids=ids, position_ids=pos, use_cache=True, **{kw: cache}).logits[0].float()
        logits = logits[-span.num_tokens :]
        tgt = torch.tensor(tokens[done : done + span.num_tokens])
        out.append(reference_processed(logits, temperature, top_p).gather(1, tgt[:, None])[:, 0].float())
        done += span.num_tokens
        start_in = end_in + 1
    return torch.cat(out)


class GatedForward:
    """Wraps ``model.forward``: blocks forward call number ``n`` (1-based) at its end until released,
    or raises at call ``fail_at``. Lets a test land a weight update after an exact token."""

    def __init__(self, model, gates=(), fail_at=None):
        self.model, self.calls = model, 0
        self.gates = {n: threading.Event() for n in gates}
        self.reached = {n: threading.Event() for n in gates}
        self.fail_at = fail_at
        inner = model.forward

        @functools.wraps(inner)
        def forward(*args, **kwargs):
            self.calls += 1
            n = self.calls
            if self.fail_at is not None and n == self.fail_at:
                raise RuntimeError("simulated device failure")
            out = inner(*args, **kwargs)
            if n in self.gates:
                self.reached[n].set()
                assert self.gates[n].wait(30), "gate never released"
            return out

        model.forward = forward
