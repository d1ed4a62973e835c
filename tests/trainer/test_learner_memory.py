"""The learner's memory hygiene: one copy of tied weights for the engine, the free heap released before a step."""

from __future__ import annotations

import torch
import transformers

from agentenv.engines.weights import check_state_dict, copy_into
from agentenv.trainer.learners import single as learner_module
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner

from .conftest import make_trajectories, tiny_model


def _tied(seed: int):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg)


def test_tied_weights_are_copied_once_for_the_engine(tmp_path):
    model = _tied(1)
    learner = Learner(model, OptimConfig())
    sd = learner.weights_for_engine()
    emb, head = sd["model.embed_tokens.weight"], sd["lm_head.weight"]
    assert emb is head  # one copy under both names
    assert emb.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # a copy, not the live tensor
    assert torch.equal(emb, model.model.embed_tokens.weight)
    fresh = _tied(2)
    fresh.load_state_dict(sd)  # every name present
    assert torch.equal(fresh.lm_head.weight, model.lm_head.weight)
    from safetensors.torch import load_file

    on_disk = load_file(str(learner.weights_for_engine(tmp_path / "w.safetensors")))
    assert "lm_head.weight" not in on_disk and torch.equal(on_disk["model.embed_tokens.weight"], emb)
    engine_model = _tied(3)
    check_state_dict(engine_model, on_disk)  # one name of the tied pair is enough for the engine
    copy_into(engine_model, on_disk)
    assert torch.equal(engine_model.lm_head.weight, model.lm_head.weight)
    # an untied model: every tensor its own copy
    untied = Learner(tiny_model(3), OptimConfig()).weights_for_engine()
    assert untied["lm_head.weight"].data_ptr() != untied["model.embed_tokens.weight"].data_ptr()


def test_free_heap_is_released_before_the_first_forward(monkeypatch):
    events = []
    monkeypatch.setattr(learner_module, "release_free_heap", lambda: events.append("release") or True)
    model = tiny_model(5)
    model.model.register_forward_pre_hook(lambda *a: events.append("forward"))  # the decoder runs in every pass
    learner = Learner(model, OptimConfig(),
                      objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=2))
    learner.update(make_trajectories(4, seed=5, rewards=[1, 0, 1, 0]))
    assert events[0] == "release" and events.count("release") == 1 and events.count("forward") == 2
