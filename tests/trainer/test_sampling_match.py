"""The learner scores log pi under the engine's sampling transform (temperature, top-p, top-k).

Same weights, lag 0: the behaviour log mu the engine stored and the learner's log pi must describe the
same distribution, so |log pi - log mu| is ~0 and the Bernoulli-KL gate admits the rows. The identity
transform (the learner before the fix: temperature 1, full vocabulary) is checked to fail the same
test, so these tests bite.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
import torch

from agentenv.engines.base import SamplingParams
from agentenv.engines.sampling import SamplingTransform
from agentenv.errors import ConfigError
from agentenv.rollout.episode import RolloutConfig
from agentenv.trainer.learners.config import LearnerConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trainer.trust_gate import bernoulli_kl_gate
from agentenv.trajectory import Trajectory

DELTA = 1e-3
CASES = [(0.6, 0.9, None), (0.6, 0.9, 5), (0.6, 1.0, 20)]  # (temperature, top_p, top_k)


def peaked_model(vocab_size: int = 49152):
    """A seeded tiny random Llama whose final norm is scaled up: logits with a std of a few nats.

    An untouched random model is almost uniform over the vocabulary, where temperature and top-p barely
    change the log-probabilities; scaling the norm gives a distribution as peaked as a trained model's
    (mean behaviour log-probability of about -4 nats with top-p 0.9 at temperature 0.6).
    """
    from agentenv.models import tiny_random_model

    model = tiny_random_model(vocab_size=vocab_size, seed=3)
    with torch.no_grad():
        model.model.norm.weight.mul_(6.0)
    return model.eval()


async def two_turn_rollouts(engine, prompts, observation, params_of) -> list[Trajectory]:
    """One trajectory per prompt: a sampled turn, an observation, a second sampled turn (version 0)."""

    async def one(i, prompt):
        tr = Trajectory(task_id=f"task{i}", id=f"traj{i}")
        tr.append_environment_tokens(list(prompt))
        tr.prompt_length = len(prompt)
        for turn in range(2):
            out = await engine.generate(tr.token_ids, params_of(i, turn))
            assert out.token_ids and all(s.version == 0 for s in out.spans)
            tr.append_policy_tokens(out.token_ids, out.logprobs, 0, 0)
            if turn == 0:
                tr.append_environment_tokens(list(observation))
        tr.reward = float(i % 2)
        return tr

    return list(await asyncio.gather(*[one(i, p) for i, p in enumerate(prompts)]))


def match(trajectories: list[Trajectory], scores: list[torch.Tensor]) -> tuple[float, float]:
    """``(median |log pi - log mu| over all policy tokens (nats), fraction of rows the gate admits)``."""
    diffs, admitted = [], []
    for tr, q in zip(trajectories, scores, strict=True):
        mu = torch.tensor([lp for lp, m in zip(tr.behaviour_logprobs, tr.loss_mask, strict=True) if m])
        assert q.shape == mu.shape
        diffs.append((q.double() - mu.double()).abs())
        _, adm = bernoulli_kl_gate(q[None], mu[None], torch.ones(1, len(q), dtype=torch.bool), DELTA)
        admitted.append(bool(adm))
    return float(torch.cat(diffs).median()), sum(admitted) / len(admitted)


@pytest.mark.parametrize(("temperature", "top_p", "top_k"), CASES)
def test_transformers_engine_behaviour_matches_the_learner(temperature, top_p, top_k):
    from agentenv.engines.transformers_engine import TransformersEngine

    vocab = 49152
    prompts = [[(7 + 13 * i + 5 * j) % vocab for j in range(4 + i)] for i in range(8)]
    observation = [11, 12, 13]

    def params_of(i, turn):
        return SamplingParams(
            max_new_tokens=12, temperature=temperature, top_p=top_p, top_k=top_k, seed=100 * i + turn
        )

    async def rollouts():
        engine = TransformersEngine(peaked_model(vocab), max_batch_size=8)
        try:
            return await two_turn_rollouts(engine, prompts, observation, params_of)
        finally:
            await engine.close()

    trajs = asyncio.run(rollouts())
    transform = SamplingTransform(temperature, top_p, top_k)
    learner = Learner(peaked_model(vocab), OptimConfig(lr=1e-9),
                      execution=LearnerConfig(micro_batch_size=4),
                      sampling=transform)
    med, adm = match(trajs, learner.score(trajs))
    assert med < 0.02 and adm >= 0.95, (med, adm)

    # The old learner (temperature 1, full vocabulary) on the same rows: far off, the gate rejects.
    old = Learner(peaked_model(vocab), OptimConfig(lr=1e-9), execution=LearnerConfig(micro_batch_size=4))
    med_old, adm_old = match(trajs, old.score(trajs))
    print(f"transformers T={temperature} top_p={top_p} top_k={top_k}: fixed median {med:.2e} admitted {adm:.2f}; "
          f"identity median {med_old:.3f} admitted {adm_old:.2f}")
    assert med_old > 0.02 and adm_old <= 0.5, (med_old, adm_old)

    # Training uses the transform too: gated on the training forward (no scores passed), the rows pass.
    stats = learner.update(trajs)
    assert stats.objective.admitted_fraction >= 0.95
    stats_old = old.update(trajs)
    assert stats_old.objective.admitted_fraction <= 0.5


def test_train_config_refuses_bad_sampling_before_anything_loads():
    from agentenv.trainer.config import TrainConfig
    from agentenv.trainer.learners.backends import build_learner, sampling_transform

    for bad in [{"temperature": 0.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -1}, {"top_k": 1.5}]:
        with pytest.raises(ConfigError):
            TrainConfig(rollout=RolloutConfig(**bad))
    with pytest.raises(ConfigError):
        RolloutConfig(temperature=-0.6)
    assert RolloutConfig(top_k=0).top_k == 0  # 0 is "off", as None
    cfg = TrainConfig(rollout=RolloutConfig(temperature=0.6, top_p=0.9, top_k=5))
    assert sampling_transform(cfg) == SamplingTransform(0.6, 0.9, 5)
    learner = build_learner(cfg, peaked_model(256))
    assert learner.sampling == SamplingTransform(0.6, 0.9, 5)


def test_yaml_style_config_carries_top_k():
    from agentenv.configio import load_config
    from agentenv.trainer.config import TrainConfig

    cfg = load_config(TrainConfig, {"rollout": {"temperature": 0.6, "top_p": 0.9, "top_k": 40}})
    assert cfg.rollout.top_k == 40
    with pytest.raises(ConfigError):
        load_config(TrainConfig, {"rollout": {"top_k": -3}})


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed (scripts/install_vllm.sh)")
@pytest.mark.parametrize(("temperature", "top_p", "top_k"), [(0.6, 0.9, None), (0.6, 0.9, 20)])
def test_vllm_engine_behaviour_matches_the_learner(monkeypatch, temperature, top_p, top_k):
    """vLLM (processed log-probabilities) against the learner on the same real model (SmolLM2-135M)."""
    from transformers import AutoModelForCausalLM

    from agentenv.engines.vllm_engine import VLLMEngine
    from agentenv.models import default_model_dir
    from tests.engines.test_vllm_engine import PROMPT

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    prompts = [PROMPT[: len(PROMPT) - 3 * i] + PROMPT[-3:] for i in range(4)]
    observation = [2, 198, 1, 4093, 198, 2683, 359, 2, 198, 1, 520, 9531, 198]  # a short user turn

    def params_of(i, turn):
        return SamplingParams(
            max_new_tokens=16, temperature=temperature, top_p=top_p, top_k=top_k, seed=100 * i + turn
        )

    async def rollouts():
        engine = VLLMEngine("default", max_context_tokens=512, max_batch_size=4, dtype="float32")
        try:
            return await two_turn_rollouts(engine, prompts, observation, params_of)
        finally:
            await engine.close()

    trajs = asyncio.run(rollouts())
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    transform = SamplingTransform(temperature, top_p, top_k)
    med, adm = match(trajs, Learner(model, OptimConfig(),
                                    execution=LearnerConfig(micro_batch_size=4),
                                    sampling=transform).score(trajs))
    assert med < 0.02 and adm >= 0.95, (med, adm)
    med_old, adm_old = match(trajs, Learner(model, OptimConfig(),
                                            execution=LearnerConfig(micro_batch_size=4)).score(trajs))
    print(f"vllm T={temperature} top_p={top_p} top_k={top_k}: fixed median {med:.2e} admitted {adm:.2f}; "
          f"identity median {med_old:.3f} admitted {adm_old:.2f}")
    assert med_old > 0.02 and adm_old <= 0.5, (med_old, adm_old)
