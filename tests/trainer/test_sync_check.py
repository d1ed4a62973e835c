"""The sampling check: the engine samples the policy version it claims, or the run stops naming the version.

A real TransformersEngine and the single-process Learner on a random 1-layer Llama; the sync that
"does nothing" is an engine that takes each new version number but keeps its weights (as an engine
that reloaded an adapter under the same name and kept serving the old one).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from agentenv.engines.base import GenerationOutput, TokenSpan
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from agentenv.trainer.setup import LoopParts
from agentenv.trainer.sync_check import (
    BFLOAT16_BOUND,
    FLOAT32_BOUND,
    PROBE_ROWS,
    PROBE_TOKENS,
    SamplingMismatch,
    gap_bound,
    sync_check,
)
from tests.fakes import CharRenderer, EvenCharEnv, tiny_llama

pytestmark = pytest.mark.timeout(120)

OVERRIDES = ["warmup.steps=0", "eval.problems=0", "run.batch_size=8", "run.concurrency=8", "run.max_pool_size=16",
             "run.checkpoint_every=100", "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=2",
             "rollout.max_total_tokens=4", "learner.micro_batch_size=8", "optim.lr=0.05", "optim.lr_schedule=constant",
             "optim.warmup_ratio=0", "objective.delta=100.0", "staleness.drift_mode=token_share",
             "model.max_batch_size=8", "--updates", "3"]


class DeafEngine:
    """Takes every new version number and keeps its weights: its tokens say the new version, its samples the old."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return self.engine.max_context_tokens

    async def generate(self, prompt_ids, params) -> GenerationOutput:
        out = await self.engine.generate(prompt_ids, params)
        return replace(out, spans=[TokenSpan(s.num_tokens, self._version, self._version) for s in out.spans])

    async def update_weights(self, weights, version) -> None:
        self._version = version  # the weights are dropped

    async def close(self) -> None:
        await self.engine.close()


def run(tmp_path, build_engine=None, extra=()):
    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_llama(vocab_size=300), None, CharRenderer()),
                      env_factory=lambda cfg, *_: EvenCharEnv)
    if build_engine is not None:
        parts = replace(parts, build_engine=build_engine)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *OVERRIDES, *extra])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    return asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 100)), run_dir


def test_a_correct_sync_logs_a_gap_within_the_bound_after_every_update(tmp_path):
    summary, run_dir = run(tmp_path)
    assert summary["updates"] == 3
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["sync/probe_logprob_gap"] for r in rows if r["learner/stepped"]]
    assert len(gaps) == 3
    # float32 engine and learner at the same weights: numerics only, far below the bound
    assert all(0 <= g < FLOAT32_BOUND / 10 for g in gaps), gaps
    # the engine decodes the learner's own parameters: no weights move
    assert [(r["sync/bytes"], r["sync/seconds"]) for r in rows] == [(0.0, 0.0)] * 3


def test_a_sync_that_does_not_take_stops_the_run_at_the_first_update(tmp_path):
    def deaf(cfg, model, tokenizer):
        return DeafEngine(TransformersEngine(model, None, max_batch_size=8, seed=cfg.run.seed))

    with pytest.raises(SamplingMismatch, match=r"does not sample policy version 1: .* nats per token \(bound 1e-05\)"):
        run(tmp_path, deaf)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows == []  # stopped before the first update was logged


async def test_an_engine_that_labels_another_version_is_named():
    engine = TransformersEngine(tiny_llama(vocab_size=300), None, max_batch_size=2, seed=0)
    cfg, _ = recipe.parse_args(["warmup.steps=0"])
    check = sync_check(cfg)
    check.prompts = [[1, 2, 3]]
    try:
        with pytest.raises(SamplingMismatch, match=r"sync to policy version 4 the engine sampled the probe under "
                                                   r"version\(s\) \[0\]"):
            await check.after_sync(engine, learner=None, version=4)  # the engine still serves version 0
    finally:
        await engine.close()


def test_the_probe_is_the_first_rows_prompts_taken_once():
    from agentenv.trajectory import Trajectory

    cfg, _ = recipe.parse_args([])
    check = sync_check(cfg)
    assert (check.params.max_new_tokens, check.params.temperature, check.params.top_p) == (PROBE_TOKENS, 1.0, 1.0)

    def traj(prompt, reply):
        t = Trajectory()
        t.append_environment_tokens(prompt)
        t.prompt_length = len(prompt)
        t.append_policy_tokens(reply, [-1.0] * len(reply), 0, 0)
        return t

    batch = [traj([i, i + 1], [9]) for i in range(6)]
    check.take_prompts(batch)
    assert check.prompts == [[i, i + 1] for i in range(PROBE_ROWS)]
    check.take_prompts([traj([7], [9])])  # later batches do not change the probe
    assert check.prompts == [[i, i + 1] for i in range(PROBE_ROWS)]


def test_the_bound_follows_the_engines_precision_and_a_forced_lag_turns_the_check_off():
    assert gap_bound(recipe.parse_args([])[0]) == FLOAT32_BOUND
    assert gap_bound(recipe.parse_args(["model.engine=vllm"])[0]) == BFLOAT16_BOUND
    assert gap_bound(recipe.parse_args(["model.device=cuda"])[0]) == BFLOAT16_BOUND
    assert gap_bound(recipe.parse_args(["learner.backend=openrlhf", "learner.param_dtype=bf16"])[0]) == BFLOAT16_BOUND
    assert sync_check(recipe.parse_args(["staleness.forced_lag=2", "staleness.policy=none"])[0]) is None


class GaugeEngine:
    """Counts the probe's requests in flight at once; raises ``fail`` from every request when given."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.version, self.fail = 0, fail
        self.in_flight = self.most = 0

    async def generate(self, prompt_ids, params) -> GenerationOutput:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        if self.fail is not None:
            raise self.fail
        return GenerationOutput(token_ids=[5], logprobs=[-1.0], spans=[TokenSpan(1, 3, 3)], finish_reason="length")


async def test_the_probe_requests_share_the_engine_and_a_dying_engine_skips_the_check():
    from agentenv.errors import EngineError

    cfg, _ = recipe.parse_args(["warmup.steps=0"])
    check = sync_check(cfg)
    check.prompts = [[1, 2], [3, 4], [5, 6], [7, 8]]
    engine = GaugeEngine(fail=EngineError("engine process died"))
    assert await check.after_sync(engine, learner=None, version=3) is None  # skipped, not a mismatch
    assert engine.most == 4  # all four in flight together, not one after the other
    with pytest.raises(ValueError, match="not an engine error"):
        await check.after_sync(GaugeEngine(fail=ValueError("not an engine error")), learner=None, version=3)


class CopyingEngine:
    """An engine with its own copy of the weights (the loop cannot decode in place through it): every
    version is copied into it, and the names of each update are kept."""

    def __init__(self, engine: TransformersEngine) -> None:
        self.engine = engine
        self.updates: list[tuple[int, set[str], int]] = []  # (version, tensor names, elements)

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def max_context_tokens(self) -> int:
        return self.engine.max_context_tokens

    async def generate(self, prompt_ids, params) -> GenerationOutput:
        return await self.engine.generate(prompt_ids, params)

    async def update_weights(self, weights, version) -> None:
        self.updates.append((version, set(weights), sum(t.numel() for t in weights.values())))
        await self.engine.update_weights(weights, version)

    async def close(self) -> None:
        await self.engine.close()


LORA = ["learner.lora_rank=4", "learner.lora_alpha=8"]


def test_lora_syncs_only_the_adapters_to_a_copied_engine_which_then_samples_the_learners_policy(tmp_path):
    engines: list[CopyingEngine] = []

    def copying(cfg, model, tokenizer):
        engines.append(CopyingEngine(TransformersEngine(model, None, max_batch_size=8, seed=cfg.run.seed)))
        return engines[-1]

    summary, run_dir = run(tmp_path, copying, extra=LORA)
    assert summary["updates"] == 3
    (engine,) = engines
    model = engine.engine.model
    adapters = {n for n, p in model.named_parameters() if "lora_" in n}
    full = sum(t.numel() for t in model.state_dict().values())
    assert [v for v, _, _ in engine.updates] == [1, 2, 3]
    for _, names, elements in engine.updates:
        assert names == adapters and elements < full / 10  # the adapters, every one of them, and nothing else
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    gaps = [r["sync/probe_logprob_gap"] for r in rows if r["learner/stepped"]]
    assert len(gaps) == 3 and all(0 <= g < FLOAT32_BOUND / 10 for g in gaps), gaps
    # each row says what moved: the adapters' float32 bytes, and the time the copy took
    assert [r["sync/bytes"] for r in rows] == [4.0 * elements for _, _, elements in engine.updates]
    assert all(r["sync/seconds"] > 0 for r in rows)


def test_an_engine_that_keeps_the_old_adapter_stops_a_lora_run_at_the_first_update(tmp_path):
    def deaf(cfg, model, tokenizer):
        return DeafEngine(TransformersEngine(model, None, max_batch_size=8, seed=cfg.run.seed))

    with pytest.raises(SamplingMismatch, match=r"does not sample policy version 1: .* nats per token \(bound 1e-05\)"):
        run(tmp_path, deaf, extra=LORA)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""
