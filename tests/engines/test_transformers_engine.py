"""TransformersEngine: batching, exact behaviour log-probs, partial-rollout continuation, failures."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from agentenv.engines.base import ContinuationMode, GenerationEngine, SamplingParams, TokenSpan
from agentenv.engines.shared_weights import SharedWeights
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.engines.weights import copy_into
from agentenv.errors import ClosedError, ConfigError, EngineError, WeightUpdateError
from agentenv.models import tiny_random_model
from tests.engines.helpers import GatedForward, full_forward_logprobs, keep_mode_logprobs

PROMPTS = [[5 + i + 7 * j for j in range(3 + 4 * i)] for i in range(6)]  # lengths 3, 7, ..., 23


@pytest.fixture(scope="module")
def refs():
    """Reference copies of the weights of versions 0, 1, 2 (never served)."""
    return [tiny_random_model(seed=s) for s in range(3)]


async def wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


async def test_engine_satisfies_protocol():
    engine = TransformersEngine(tiny_random_model())
    assert isinstance(engine, GenerationEngine)
    assert engine.max_context_tokens == 2048 and engine.version == 0
    await engine.close()
    await engine.close()  # twice is fine
    with pytest.raises(ClosedError):
        await engine.generate([1, 2], SamplingParams(max_new_tokens=2))


async def test_concurrent_requests_equal_one_at_a_time(refs):
    params = [SamplingParams(max_new_tokens=12 + 3 * i, seed=100 + i) for i in range(len(PROMPTS))]
    engine = TransformersEngine(tiny_random_model(seed=0), max_batch_size=4)  # 6 requests > 4 slots
    batched = await asyncio.gather(*[engine.generate(p, s) for p, s in zip(PROMPTS, params, strict=True)])
    assert engine.num_steps < sum(s.max_new_tokens for s in params)  # rows really shared steps
    for prompt, sp, out in zip(PROMPTS, params, batched, strict=True):
        alone = await engine.generate(prompt, sp)
        assert out.token_ids == alone.token_ids
        assert len(out.token_ids) == sp.max_new_tokens and out.finish_reason == "length"
        assert out.spans == [TokenSpan(sp.max_new_tokens, 0, 0)]
        torch.testing.assert_close(
            torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=1e-4, rtol=0
        )
        ref = full_forward_logprobs(refs[0], prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
    await engine.close()


async def test_temperature_and_top_p_logprobs_are_the_processed_ones(refs):
    engine = TransformersEngine(tiny_random_model(seed=0))
    prompt = PROMPTS[2]
    for temp, top_p in [(0.7, 1.0), (1.3, 0.9), (0.5, 0.6)]:
        out = await engine.generate(
            prompt, SamplingParams(max_new_tokens=16, temperature=temp, top_p=top_p, seed=7)
        )
        got = torch.tensor(out.logprobs)
        assert torch.isfinite(got).all()  # every sampled token lies inside the nucleus
        ref = full_forward_logprobs(refs[0], prompt, out.token_ids, temp, top_p)
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
        raw = full_forward_logprobs(refs[0], prompt, out.token_ids)
        assert (got - raw).abs().max() > 1e-2  # the raw log-probs would be a different (wrong) answer
    await engine.close()


async def test_greedy_and_stop_tokens():
    engine = TransformersEngine(tiny_random_model(seed=0))
    prompt = PROMPTS[1]
    free = await engine.generate(prompt, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert free.logprobs == [0.0] * 10
    again = await engine.generate(prompt, SamplingParams(max_new_tokens=10, temperature=0.0))
    assert again.token_ids == free.token_ids  # greedy is deterministic
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    out = await engine.generate(
        prompt, SamplingParams(max_new_tokens=10, temperature=0.0, stop_token_ids=(stop,))
    )
    assert out.token_ids == free.token_ids[: first + 1]  # stop token included, nothing after it
    assert out.finish_reason == "stop" and not out.truncated_context
    await engine.close()


async def test_context_limit_truncates():
    engine = TransformersEngine(tiny_random_model(), max_context_tokens=20)
    out = await engine.generate(list(range(10, 25)), SamplingParams(max_new_tokens=10, seed=1))
    assert len(out.token_ids) == 5 and out.finish_reason == "length" and out.truncated_context
    out = await engine.generate(list(range(10, 30)), SamplingParams(max_new_tokens=10))
    assert out.token_ids == [] and out.truncated_context
    out = await engine.generate(list(range(10, 15)), SamplingParams(max_new_tokens=3, seed=1))
    assert len(out.token_ids) == 3 and out.finish_reason == "length" and not out.truncated_context
    with pytest.raises(EngineError, match="exceeds the context limit"):
        await engine.generate(list(range(10, 31)), SamplingParams(max_new_tokens=1))
    with pytest.raises(EngineError, match="empty prompt"):
        await engine.generate([], SamplingParams())
    with pytest.raises(EngineError, match="outside the vocabulary"):
        await engine.generate([49152], SamplingParams())
    with pytest.raises(ConfigError):
        await engine.generate([1], SamplingParams(top_p=0.0))
    await engine.close()


class InPlaceLearner:
    """Writes a reference's weights into the served model itself, as a learner's optimizer step would."""

    def __init__(self, model):
        self.model, self.version = model, 0
        self.shared = SharedWeights(lambda: self.version)

    def step_to(self, weights, version):
        with self.shared.writing():
            copy_into(self.model, weights)
            self.version = version


@pytest.mark.parametrize("in_place", [False, True], ids=["copied", "in-place"])
@pytest.mark.parametrize("mode", [ContinuationMode.KEEP, ContinuationMode.RECOMPUTE])
async def test_interrupted_twice_gives_three_spans_from_the_right_weights(refs, mode, in_place):
    """New weights copied in, or written in place by the learner, land after the decoding step in progress."""
    model = tiny_random_model(seed=0)
    # forward calls: 1 prefill, then one per token. RECOMPUTE adds a re-prefill call after each update.
    gates = (6, 16) if mode is ContinuationMode.KEEP else (6, 17)
    gate = GatedForward(model, gates=gates)
    engine = TransformersEngine(model, continuation=mode)
    learner = InPlaceLearner(model)
    if in_place:
        engine.serve_in_place(model, learner.shared)
    prompt, params = PROMPTS[3], SamplingParams(max_new_tokens=30, temperature=0.9, seed=11)
    task = asyncio.create_task(engine.generate(prompt, params))
    for version, n in enumerate(gates, start=1):
        await wait_for(gate.reached[n].is_set)
        if in_place:  # the step waits for the decoding step in progress, and goes before the next one
            update = asyncio.create_task(asyncio.to_thread(learner.step_to, refs[version].state_dict(), version))
            await wait_for(lambda: learner.shared._writers_waiting == 1)
        else:
            update = asyncio.create_task(engine.update_weights(refs[version].state_dict(), version))
            await wait_for(lambda: not engine._inbox.empty())  # queued before the step ends
        assert not update.done()
        gate.gates[n].set()
        await update
        assert engine.version == version
    out = await task
    prefix = [0, 0, 0] if mode is ContinuationMode.KEEP else [0, 1, 2]
    assert out.spans == [TokenSpan(6, 0, prefix[0]), TokenSpan(10, 1, prefix[1]), TokenSpan(14, 2, prefix[2])]
    assert len(out.token_ids) == 30  # the budget is what remained, not 30 again after each resume
    got = torch.tensor(out.logprobs)
    if mode is ContinuationMode.KEEP:
        ref = keep_mode_logprobs(refs, prompt, out.token_ids, out.spans, temperature=0.9)
    else:  # each span is a full forward pass of its own version's weights
        parts, start = [], 0
        for version, span in enumerate(out.spans):
            full = full_forward_logprobs(refs[version], prompt, out.token_ids, temperature=0.9)
            parts.append(full[start : start + span.num_tokens])
            start += span.num_tokens
        ref = torch.cat(parts)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)
    # the swaps really changed the numbers: version-0 weights give something else after token 6
    stale = full_forward_logprobs(refs[0], prompt, out.token_ids, temperature=0.9)
    assert (stale[6:] - got[6:]).abs().max() > 1e-2
    await engine.close()


async def test_in_place_engine_takes_only_the_learners_version(refs):
    """Serving the learner's parameters, the engine loads no weights: the learner's version is a no-op."""
    model = tiny_random_model(seed=0)
    learner = InPlaceLearner(model)
    learner.version = 3
    engine = TransformersEngine(model)
    engine.serve_in_place(model, learner.shared)
    assert engine.version == 3
    await engine.update_weights(refs[1].state_dict(), 3)  # the parameters hold version 3 already
    torch.testing.assert_close(model.model.norm.weight, refs[0].model.norm.weight, rtol=0, atol=0)
    with pytest.raises(WeightUpdateError, match="in place"):
        await engine.update_weights(refs[1].state_dict(), 4)
    out = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, seed=2))
    assert out.spans == [TokenSpan(4, 3, 3)]
    with pytest.raises(EngineError, match="before the engine serves"):
        engine.serve_in_place(model, learner.shared)
    await engine.close()


async def test_keep_mode_logprobs_match_old_cache_new_weights(refs):
    """KEEP at temperature 1: the post-swap tokens are scored by new weights on an old-weights cache."""
    model = tiny_random_model(seed=0)
    gate = GatedForward(model, gates=(5,))
    engine = TransformersEngine(model, continuation=ContinuationMode.KEEP)
    prompt = PROMPTS[4]
    task = asyncio.create_task(engine.generate(prompt, SamplingParams(max_new_tokens=12, seed=3)))
    await wait_for(gate.reached[5].is_set)
    update = asyncio.create_task(engine.update_weights(refs[1].state_dict(), 1))
    await wait_for(lambda: not engine._inbox.empty())
    gate.gates[5].set()
    await update
    out = await task
    assert out.spans == [TokenSpan(5, 0, 0), TokenSpan(7, 1, 0)]
    ref = keep_mode_logprobs(refs[:2], prompt, out.token_ids, out.spans)
    torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
    recomputed = full_forward_logprobs(refs[1], prompt, out.token_ids)
    assert (recomputed[5:] - ref[5:]).abs().max() > 1e-4  # KEEP is not RECOMPUTE
    await engine.close()


async def test_failed_update_keeps_old_version(refs, tmp_path):
    engine = TransformersEngine(tiny_random_model(seed=0))
    bad_shape = dict(refs[1].state_dict())
    bad_shape["model.norm.weight"] = torch.ones(3)
    missing = {k: v for k, v in refs[1].state_dict().items() if "layers.1." not in k}
    nan = {k: v.clone() for k, v in refs[1].state_dict().items()}
    nan["model.norm.weight"][0] = float("nan")
    for weights, match in [
        (bad_shape, "shape"),
        (missing, "missing"),
        ({**refs[1].state_dict(), "extra.weight": torch.ones(1)}, "unknown"),
        (nan, "NaN"),
        (tmp_path / "nope.safetensors", "cannot read"),
    ]:
        with pytest.raises(WeightUpdateError, match=match):
            await engine.update_weights(weights, 1)
        assert engine.version == 0
    with pytest.raises(WeightUpdateError, match="must exceed"):
        await engine.update_weights(refs[1].state_dict(), 0)
    out = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8, seed=2))
    torch.testing.assert_close(
        torch.tensor(out.logprobs),
        full_forward_logprobs(refs[0], PROMPTS[0], out.token_ids),
        atol=1e-4,
        rtol=0,
    )
    # a good update from a safetensors file works afterwards, while idle
    from safetensors.torch import save_model

    save_model(refs[1], str(tmp_path / "v1.safetensors"))
    await engine.update_weights(tmp_path / "v1.safetensors", 1)
    out = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8, seed=2))
    assert out.spans == [TokenSpan(8, 1, 1)]
    torch.testing.assert_close(
        torch.tensor(out.logprobs),
        full_forward_logprobs(refs[1], PROMPTS[0], out.token_ids),
        atol=1e-4,
        rtol=0,
    )
    await engine.close()


async def test_engine_failure_mid_generation_raises_engine_error_and_recovers():
    model = tiny_random_model(seed=0)
    gate = GatedForward(model, fail_at=8)
    engine = TransformersEngine(model)
    results = await asyncio.gather(
        *[engine.generate(p, SamplingParams(max_new_tokens=20, seed=1)) for p in PROMPTS[:3]],
        return_exceptions=True,
    )
    assert all(isinstance(r, EngineError) for r in results), results
    assert "mid-request" in str(results[0])
    gate.fail_at = None
    out = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=5, seed=1))
    assert len(out.token_ids) == 5
    await engine.close()


async def test_cancelled_request_leaves_the_others_alone():
    engine = TransformersEngine(tiny_random_model())
    slow = asyncio.create_task(engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=500, seed=1)))
    await wait_for(lambda: engine.num_steps > 2)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    out = await engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=4, seed=1))
    assert len(out.token_ids) == 4
    await engine.close()


async def test_top_k_logprobs_are_the_processed_ones(refs):
    from agentenv.engines.sampling import processed_logprobs

    engine = TransformersEngine(tiny_random_model(seed=0))
    prompt = PROMPTS[2]
    out = await engine.generate(prompt, SamplingParams(max_new_tokens=16, temperature=0.8, top_k=3, seed=4))
    with torch.no_grad():
        logits = refs[0](torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
    n = logits.shape[0]
    ref = processed_logprobs(logits, torch.full((n,), 0.8), torch.ones(n), torch.full((n,), 3))
    got = torch.tensor(out.logprobs)
    torch.testing.assert_close(got, ref.gather(1, torch.tensor(out.token_ids)[:, None])[:, 0], atol=1e-4, rtol=0)
    top3 = logits.topk(3, dim=-1).indices
    assert all(t in top3[i].tolist() for i, t in enumerate(out.token_ids))  # only the 3 most likely
    with pytest.raises(ConfigError, match="top_k"):
        await engine.generate(prompt, SamplingParams(max_new_tokens=2, top_k=-2))
    await engine.close()


async def test_top_logprobs_are_the_most_likely_of_the_processed_distribution(refs):
    """Alternatives per sampled token: the k best of the distribution sampled from, against a full pass."""
    from agentenv.engines.sampling import processed_logprobs

    engine = TransformersEngine(tiny_random_model(seed=0))
    prompt = PROMPTS[2]
    for temp, top_k, k in [(0.8, None, 4), (1.0, 2, 5)]:
        out = await engine.generate(prompt, SamplingParams(max_new_tokens=12, temperature=temp, top_k=top_k,
                                                           seed=3, top_logprobs=k))
        with torch.no_grad():
            logits = refs[0](torch.tensor([prompt + out.token_ids])).logits[0, len(prompt) - 1 : -1]
        n = logits.shape[0]
        ref = processed_logprobs(logits, torch.full((n,), temp), torch.ones(n), torch.full((n,), top_k or 0))
        assert out.top_logprobs is not None and len(out.top_logprobs) == len(out.token_ids) == 12
        kept = min(k, top_k or k)  # top-k cuts the rest: they cannot be drawn, so they are not listed
        for i, (tok, alts) in enumerate(zip(out.token_ids, out.top_logprobs, strict=True)):
            values, ids = ref[i].topk(kept)
            assert [a for a, _ in alts] == ids.tolist()
            torch.testing.assert_close(torch.tensor([v for _, v in alts]), values, atol=1e-4, rtol=0)
            if tok in ids.tolist():  # the sampled token's own log-probability is the one listed
                assert dict(alts)[tok] == pytest.approx(out.logprobs[i], abs=1e-6)
    greedy = await engine.generate(prompt, SamplingParams(max_new_tokens=5, temperature=0.0, top_logprobs=3))
    assert greedy.top_logprobs == [((t, 0.0),) for t in greedy.token_ids]
    plain = await engine.generate(prompt, SamplingParams(max_new_tokens=5, seed=3))
    assert plain.top_logprobs is None
    for bad in (21, -1, True):
        with pytest.raises(ConfigError, match="top_logprobs"):
            await engine.generate(prompt, SamplingParams(max_new_tokens=2, top_logprobs=bad))
    await engine.close()


async def test_shared_prompt_prefix_is_reused_within_a_version_only(refs):
    """The system prompt every episode starts with is prefilled once per policy version."""
    system = [3 + (7 * j) % 50 for j in range(40)]  # 40 shared tokens (>= PrefixCache.min_tokens)
    prompts = [system + [60 + i, 61 + i] for i in range(3)]
    params = SamplingParams(max_new_tokens=6, seed=7)
    engine = TransformersEngine(tiny_random_model(seed=0), max_batch_size=4)
    outs = [await engine.generate(p, params) for p in prompts]
    # the first two are prefilled whole (the second finds the 40 tokens it shares with the first and
    # keeps their cache); the third computes only its own 2 tokens
    assert engine.num_prefix_hits == 1
    assert engine.prefill_tokens == 42 + 42 + 2
    for prompt, out in zip(prompts, outs, strict=True):  # same numbers as a full forward pass
        ref = full_forward_logprobs(refs[0], prompt, out.token_ids)
        torch.testing.assert_close(torch.tensor(out.logprobs), ref, atol=1e-4, rtol=0)
    # New weights: the kept prefix was computed by the old ones and must not serve the new version.
    await engine.update_weights(refs[1].state_dict(), 1)
    again = await engine.generate(prompts[0], params)
    assert engine.num_prefix_hits == 1 and again.spans == [TokenSpan(6, 1, 1)]
    ref = full_forward_logprobs(refs[1], prompts[0], again.token_ids)
    torch.testing.assert_close(torch.tensor(again.logprobs), ref, atol=1e-4, rtol=0)
    await engine.close()


async def test_next_turn_continues_the_finished_replys_cache(refs):
    """Turn 2 (prompt + reply + observation) prefills only the reply's last token and the observation."""
    prompt = [3 + (5 * j) % 40 for j in range(12)]
    params = SamplingParams(max_new_tokens=5, seed=3)
    engine = TransformersEngine(tiny_random_model(seed=0), max_batch_size=2)
    first = await engine.generate(prompt, params)
    assert len(first.token_ids) == 5 and engine.prefill_tokens == 12
    observation = [44, 45, 46]
    second_prompt = prompt + first.token_ids + observation
    second = await engine.generate(second_prompt, params)
    assert engine.num_turn_hits == 1
    assert engine.prefill_tokens == 12 + 1 + 3  # the reply's last token was never fed, then the observation
    ref = full_forward_logprobs(refs[0], second_prompt, second.token_ids)
    torch.testing.assert_close(torch.tensor(second.logprobs), ref, atol=1e-4, rtol=0)
    # each cache serves once; after new weights none is kept from the old ones
    third_prompt = second_prompt + second.token_ids + observation
    await engine.update_weights(refs[1].state_dict(), 1)
    third = await engine.generate(third_prompt, params)
    assert engine.num_turn_hits == 1 and third.spans == [TokenSpan(5, 1, 1)]
    ref = full_forward_logprobs(refs[1], third_prompt, third.token_ids)
    torch.testing.assert_close(torch.tensor(third.logprobs), ref, atol=1e-4, rtol=0)
    await engine.close()
    off = TransformersEngine(tiny_random_model(seed=0), max_batch_size=2, turn_cache=0)
    assert (await off.generate(prompt, params)).token_ids == first.token_ids
    await off.generate(second_prompt, params)  # the cache is off: the whole prompt is prefilled again
    assert off.num_turn_hits == 0 and off.prefill_tokens == 12 + len(second_prompt)
    await off.close()
