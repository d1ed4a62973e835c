"""Which engine a run gets: the learner's own parameters decoded in place, or a copy of them."""

from __future__ import annotations

import pytest

from agentenv.trainer import recipe
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.setup import LoopParts, build_learner
from agentenv.trainer.train import serve_policy
from tests.fakes import ScriptedEngine, tiny_llama


def parts_and_learner(*overrides: str):
    cfg, _ = recipe.parse_args(["warmup.steps=0", *overrides])
    model = tiny_llama(vocab_size=300)
    return cfg, model, build_learner(cfg, model)


async def test_the_transformers_engine_decodes_the_single_learners_parameters():
    cfg, model, learner = parts_and_learner()
    assert isinstance(learner, Learner)
    engine, in_place = serve_policy(cfg, LoopParts(), learner, model, None)
    assert in_place and engine.shared_weights is learner.share_weights()
    own = dict(model.named_parameters(remove_duplicate=False))
    assert all(p is own[name] for name, p in engine.model.named_parameters(remove_duplicate=False))
    assert engine.version == learner.version == 0
    await engine.close()


@pytest.mark.parametrize("overrides", [["staleness.forced_lag=2"], []], ids=["forced lag", "scripted engine"])
async def test_otherwise_the_engine_keeps_its_own_copy(overrides):
    cfg, model, learner = parts_and_learner(*overrides)
    parts = LoopParts() if overrides else LoopParts(build_engine=lambda cfg, m, tok: ScriptedEngine(["done"]))
    engine, in_place = serve_policy(cfg, parts, learner, model, None)
    assert not in_place
    if overrides:  # a forced lag: the engine serves old versions, so it has weights of its own
        own = {p.data_ptr() for p in model.parameters()}
        assert not any(p.data_ptr() in own for p in engine.model.parameters())
        assert engine.shared_weights is None
    await engine.close()
