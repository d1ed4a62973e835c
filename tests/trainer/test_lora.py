"""LoRA: adapters on the policy, adapter-only weight sync to the engine, merged export, and the loop learning with them.

Real peft adapters on a random 1-layer Llama; a real TransformersEngine serving a copy of the adapted model.
"""

from __future__ import annotations

import asyncio
import copy
import json
import statistics

import pytest
import torch
import yaml

from agentenv.engines.base import SamplingParams
from agentenv.engines.peft_adapter import base_state_dict
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.engines.weights import check_state_dict
from agentenv.errors import ConfigError, RunFolderError, WeightUpdateError
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.lora import adapter_state, add_lora, merged_state_dict
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.resume import check_resumable, run_identity
from agentenv.trainer.setup import LoopParts
from tests.fakes import CharRenderer, EvenCharEnv, tiny_llama
from tests.trainer.conftest import make_trajectories
from tests.trainer.test_learning_signal import OVERRIDES as LEARNING_OVERRIDES

pytestmark = pytest.mark.timeout(300)

# q, k, v, o, gate, up and down projections of the one layer; the output projection is not adapted
ADAPTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def adapted(rank=4, alpha=8.0, targets=("all-linear",)):
    return add_lora(tiny_llama(vocab_size=300), rank=rank, alpha=alpha, targets=targets)


def logits(model, ids=(1, 5, 7, 9, 2)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


def test_adapters_start_as_the_base_model_and_only_they_train():
    base, model = tiny_llama(vocab_size=300), adapted()
    torch.testing.assert_close(logits(model), logits(base), rtol=0, atol=0)  # B = 0 at the start
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[-4] for n in trainable} == set(ADAPTED)
    assert len(trainable) == 2 * len(ADAPTED) and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    a = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.lora_A.default.weight"]
    assert tuple(a.shape) == (4, 32)  # (r, d_in)


def test_bad_lora_settings_are_refused_with_what_the_model_has():
    with pytest.raises(ConfigError, match=r"no linear layer named qkv_proj; it has down_proj, gate_proj, k_proj, "
                                          r"lm_head, o_proj, q_proj, up_proj, v_proj"):
        adapted(targets=("q_proj", "qkv_proj"))
    with pytest.raises(ConfigError, match="lora_rank must be >= 1"):
        adapted(rank=0)
    with pytest.raises(ConfigError, match="lora_rank must be >= 0"):
        LearnerConfig(lora_rank=-1)
    assert LearnerConfig(lora_rank=8, backend="openrlhf").lora_rank == 8  # every backend trains adapters
    with pytest.raises(ConfigError, match="vLLM serves adapters of rank 512 at most"):
        recipe.parse_args(["learner.lora_rank=1024", "model.engine=vllm"])
    assert recipe.parse_args(["learner.lora_rank=8", "model.engine=vllm"])[0].learner.lora_rank == 8
    cfg, _ = recipe.parse_args(["learner.lora_rank=8", "learner.lora_target_modules=[q_proj,v_proj]"])
    assert (cfg.learner.lora_rank, cfg.learner.lora_alpha, cfg.learner.lora_target_modules) == (8, 32.0,
                                                                                            ("q_proj", "v_proj"))


def test_the_merge_is_w_plus_scale_b_a():
    w, a, b = torch.eye(2), torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0], [4.0]])  # r = 1
    state = {"m.q.base_layer.weight": w, "m.q.base_layer.bias": torch.ones(2),
             "m.q.lora_A.default.weight": a, "m.q.lora_B.default.weight": b, "m.other.weight": torch.zeros(1)}
    out = merged_state_dict(state, rank=1, alpha=2.0)
    assert set(out) == {"m.q.weight", "m.q.bias", "m.other.weight"}
    # W + (2 / 1) * B A = I + 2 [[3, 6], [4, 8]]
    torch.testing.assert_close(out["m.q.weight"], torch.tensor([[7.0, 12.0], [8.0, 17.0]]))
    with pytest.raises(ValueError, match="lacks its base weight"):
        merged_state_dict({"m.q.lora_A.default.weight": a, "m.q.lora_B.default.weight": b}, rank=1, alpha=1.0)


def test_the_base_state_is_the_adapted_models_without_its_adapters():
    """What vLLM loads as its model before serving adapters: every base tensor under its plain name, unchanged."""
    base = tiny_llama(vocab_size=300)
    expected = {n: t.clone() for n, t in base.state_dict().items()}
    model = add_lora(base, rank=4, alpha=8.0, targets=("all-linear",))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.2)  # a trained adapter: still not part of the base
    out = base_state_dict(model.state_dict())
    assert set(out) == set(expected)
    for name, t in expected.items():
        torch.testing.assert_close(out[name], t, rtol=0, atol=0)


def test_a_merged_model_computes_what_the_adapted_one_does():
    model = adapted()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.normal_(0, 0.2)  # a trained adapter
    plain = tiny_llama(vocab_size=300)
    plain.load_state_dict(merged_state_dict(model.state_dict(), rank=4, alpha=8.0))
    assert (logits(model) - logits(tiny_llama(vocab_size=300))).abs().max() > 1e-2  # the adapter matters
    torch.testing.assert_close(logits(plain), logits(model), rtol=1e-5, atol=1e-5)


def test_an_engine_takes_adapter_only_updates_that_cover_every_adapter():
    model = adapted()
    state = adapter_state(model)
    check_state_dict(model, state)  # the base weights need not come along
    with pytest.raises(WeightUpdateError, match="missing from the update"):
        check_state_dict(model, dict(list(state.items())[1:]))
    with pytest.raises(WeightUpdateError, match="unknown weight names"):
        check_state_dict(tiny_llama(vocab_size=300), state)  # a model without adapters


async def test_an_update_syncs_the_adapters_only_and_the_engine_then_samples_the_learners_policy():
    model = adapted()
    engine = TransformersEngine(copy.deepcopy(model), None, max_batch_size=2, seed=0)
    learner = Learner(model, OptimConfig(lr=0.05, weight_decay=0.0), objective=ObjectiveConfig(delta=100.0),
                      execution=LearnerConfig(micro_batch_size=8))
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    try:
        stats = learner.update(make_trajectories(8, rewards=[i % 2 for i in range(8)]))
        assert stats.stepped and learner.version == 1
        for n, p in model.named_parameters():  # the base did not move
            if n in frozen:
                torch.testing.assert_close(p, frozen[n], rtol=0, atol=0)
        sent = learner.weights_for_engine()
        assert set(sent) == {n for n, p in model.named_parameters() if p.requires_grad}
        full = sum(t.numel() for t in model.state_dict().values())
        assert sum(t.numel() for t in sent.values()) < full / 10  # rank 4 on a 32-wide layer
        await engine.update_weights(sent, learner.version)
        out = await engine.generate([1, 2, 3], SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))
        scored = learner.score([_as_trajectory([1, 2, 3], out)])[0]
        torch.testing.assert_close(scored, torch.tensor(out.logprobs), rtol=0, atol=1e-5)
    finally:
        await engine.close()


def _as_trajectory(prompt, out):
    from agentenv.trajectory import Trajectory

    t = Trajectory()
    t.append_environment_tokens(prompt)
    t.prompt_length = len(prompt)
    t.append_policy_tokens(out.token_ids, out.logprobs, 1, 1)
    return t


def test_resuming_with_other_adapters_is_refused():
    saved, _ = recipe.parse_args(["learner.lora_rank=8"])
    now, _ = recipe.parse_args(["learner.lora_rank=16"])
    with pytest.raises(RunFolderError, match=r"lora \{'rank': 8.*this run: \{'rank': 16"):
        check_resumable(None, {"identity": run_identity(saved, 1)}, run_identity(now, 1))
    full, _ = recipe.parse_args([])
    with pytest.raises(RunFolderError, match=r"lora .*this run: None"):
        check_resumable(None, {"identity": run_identity(saved, 1)}, run_identity(full, 1))


def test_the_async_loop_learns_a_small_task_with_lora_and_exports_merged_weights(tmp_path):
    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_llama(), None, CharRenderer()),
                      env_factory=lambda cfg, *_: EvenCharEnv)
    cfg, _ = recipe.parse_args(["--run-dir", str(tmp_path / "run"), *LEARNING_OVERRIDES, "learner.lora_rank=4",
                                "learner.lora_alpha=8", "optim.lr=0.05", "run.checkpoint_every=5",
                                f"learner.lora_target_modules=[{','.join(ADAPTED)},lm_head]"])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, parts=parts), 280))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward/mean"] for r in rows]
    first, last = statistics.fmean(rewards[:5]), statistics.fmean(rewards[-5:])
    assert summary["updates"] >= 10 and last >= first + 0.25, rewards
    # the engine decoded the learner's adapted parameters in place and sampled its policy (float32:
    # numerics only); adapter-only syncs to an engine with its own copy: tests/trainer/test_sync_check.py
    assert all(r["sync/probe_logprob_gap"] < 1e-5 for r in rows if r["learner/stepped"])
    # the checkpoint merges into the base model's names
    from safetensors.torch import load_file

    from agentenv.trainer.checkpoint import latest_checkpoint

    saved = load_file(str(latest_checkpoint(run_dir / "checkpoints") / "model.safetensors"))
    assert any(".lora_B." in k for k in saved)
    merged = merged_state_dict(saved, rank=4, alpha=8.0)
    assert set(merged) <= set(tiny_llama().state_dict())
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["learner"]["lora_rank"] == 4


def test_a_target_the_model_lacks_is_refused_before_the_warm_up(monkeypatch):
    import agentenv.models
    from agentenv.trainer import setup

    warmed = []
    monkeypatch.setattr(agentenv.models, "load_model_and_tokenizer", lambda name, **_: (tiny_llama(), None))
    monkeypatch.setattr(setup, "warmed_up", lambda *a, **k: warmed.append(1))
    cfg, _ = recipe.parse_args(["learner.lora_rank=8", "learner.lora_target_modules=[q_proj,c_attn]"])
    assert cfg.warmup.steps > 0  # the default recipe warms up
    with pytest.raises(ConfigError, match=r"no linear layer named c_attn; it has down_proj, gate_proj, k_proj"):
        setup.load_policy(cfg)
    assert warmed == []


def test_a_lora_run_resumes_with_its_adapters_and_its_base_unchanged(tmp_path):
    from safetensors.torch import load_file

    from agentenv.trainer import setup
    from tests.trainer.test_sync_check import OVERRIDES as SHORT

    restored = {}

    def build_learner(cfg, model):  # keeps the adapters the learner holds right after a restore
        learner = setup.build_learner(cfg, model)
        restore = learner.restore

        def keep(root):
            out = restore(root)
            restored.update(adapter_state(learner.model))
            return out

        learner.restore = keep
        return learner

    def train(updates, resume):
        parts = LoopParts(load_policy=lambda cfg, **_: (tiny_llama(vocab_size=300), None, CharRenderer()),
                          env_factory=lambda cfg, *_: EvenCharEnv, build_learner=build_learner)
        argv = ["--run-dir", str(tmp_path / "run"), *SHORT, "--updates", str(updates), "run.checkpoint_every=1",
                "learner.lora_rank=4", "learner.lora_alpha=8", *(["--resume"] if resume else [])]
        cfg, args = recipe.parse_args(argv)
        run_dir = recipe.prepare_run_dir(cfg, resume=resume, overwrite=False)
        if resume:
            cfg = recipe.resumed_config(run_dir, args.overrides)
        return asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, resume=resume, parts=parts), 100))

    assert train(2, resume=False)["updates"] == 2
    ckpts = tmp_path / "run" / "checkpoints"
    at_2 = load_file(str(ckpts / "v00000002" / "model.safetensors"))
    assert train(3, resume=True)["updates"] == 3
    assert restored and all(torch.equal(t, at_2[n]) for n, t in restored.items())  # the adapters of version 2
    at_3 = load_file(str(ckpts / "v00000003" / "model.safetensors"))
    assert set(at_3) == set(at_2) and any(".lora_B." in k for k in at_3)
    for name, t in at_3.items():
        if ".lora_" in name:
            continue
        torch.testing.assert_close(t, at_2[name], rtol=0, atol=0)  # the base stayed frozen across the resume
    moved = [n for n in at_3 if ".lora_" in n and not torch.equal(at_3[n], at_2[n])]
    assert moved  # the third update trained the restored adapters
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3] and rows[-1]["resume/count"] == 1
