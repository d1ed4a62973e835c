"""``agentenv train``'s loop with ``learner.backend: openrlhf``: real DeepSpeed updates (ZeRO-2, gloo,
one process) inside the recipe's ``train()``, a checkpoint, a ``--resume`` that restores DeepSpeed's
state, and every update equal to the single-process learner's on the same batch.

The model side is tiny and real: a random 2-layer Llama (1024-token vocabulary) served by the
TransformersEngine, the CharRenderer of ``tests.fakes``, and a one-turn env whose reward is the parity
of the task seed (so a batch has mixed rewards). Each update the recipe makes is recorded (the
trajectories, the PACE scores, the weights before and after) and replayed in this process through
:class:`agentenv.trainer.learners.single.Learner`; equal weights after two updates, the second after a resume,
mean the weights, Adam's moments and step count, and the learning rate were all restored
(``adam_eps = 10`` makes the step about linear in the gradient, as in ``test_openrlhf_backend.py``;
weight decay 0 because OpenRLHF exempts norm weights from it).
Budget: about 20 s (one spawned process; imports dominate).
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed: run scripts/install_openrlhf.sh")
pytest.importorskip("openrlhf", reason="needs openrlhf: run scripts/install_openrlhf.sh")

from agentenv.core import Env, StepResult  # noqa: E402
from agentenv.trainer.learners.cpu_data_parallel import run_cpu_data_parallel  # noqa: E402
from tests.fakes import CharRenderer  # noqa: E402

pytestmark = [pytest.mark.openrlhf, pytest.mark.slow]

OVERRIDES = [
    "learner.backend=openrlhf", "learner.zero_stage=2", "warmup.steps=0",
    "run.batch_size=4", "run.concurrency=4", "run.max_pool_size=8", "run.checkpoint_every=1",
    "rollout.max_turns=1", "rollout.max_new_tokens_per_turn=6", "rollout.max_total_tokens=16",
    "optim.lr=0.1", "optim.adam_eps=10.0", "optim.weight_decay=0.0", "optim.lr_schedule=constant",
    "optim.warmup_ratio=0", "optim.warmup_steps=2",
    "learner.micro_batch_size=2", "optim.step_on_zero_gradient=false",
]


def tiny_lm() -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    return transformers.LlamaForCausalLM(cfg).eval()


class SeedParityEnv(Env[str, str]):
    """One turn; reward 1 for an odd task seed, else 0 (whatever the reply, also one cut by the budget)."""

    cut_turn = "act"  # the random model's 6-token replies never close their turn: score them anyway

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self.seed = seed
        return f"task {seed}", {"task_id": f"t{seed}"}

    async def step(self, action):
        return StepResult("ok", float(self.seed % 2), True, False, {})


def recording(build_learner, calls: list[dict]):
    """Wrap a ``setup.build_learner``: every ``learner.update`` call is appended to ``calls``."""

    def build(cfg, model):
        learner = build_learner(cfg, model)
        update = learner.update

        def recorded(trajectories, *, scores=None):
            before = learner.weights_for_engine()
            stats = update(trajectories, scores=scores)
            calls.append({"batch": [t.to_dict() for t in trajectories], "scores": scores, "before": before,
                          "after": learner.weights_for_engine(), "version": stats.version,
                          "stepped": stats.stepped, "grad_norm": stats.grad_norm,
                          "learner": type(learner).__name__})
            return stats

        learner.update = recorded
        return learner

    return build


def train_then_resume(run_dir: str, overrides: list[str], parts=None) -> dict:
    """``train()`` to version 1, then ``train(resume=True)`` to 2; the recorded updates and both summaries.

    ``parts``: the loop's parts (default: the config's), with the learner recording its updates and
    :class:`SeedParityEnv` as the environment.
    """
    import asyncio
    from dataclasses import replace
    from pathlib import Path

    from agentenv.trainer.recipe import parse_args, prepare_run_dir
    from agentenv.trainer.setup import LoopParts
    from agentenv.trainer.train import train

    calls: list[dict] = []
    parts = parts or LoopParts()
    parts = replace(parts, build_learner=recording(parts.build_learner, calls),
                    env_factory=lambda cfg, *_: SeedParityEnv)
    cfg, _ = parse_args(["--run-dir", run_dir, "--updates", "1", *overrides])
    first = asyncio.run(train(cfg, prepare_run_dir(cfg, resume=False, overwrite=False), parts=parts))
    n_first = len(calls)
    cfg2, _ = parse_args(["--run-dir", run_dir, "--updates", "2", *overrides])
    second = asyncio.run(train(cfg2, Path(run_dir), resume=True, parts=parts))
    return {"calls": calls, "n_first": n_first, "summaries": (first, second)}


def _train_and_resume(rank: int, run_dir: str):
    """In a fresh process: the tiny model served by a real TransformersEngine, then train_then_resume."""
    from agentenv.engines.transformers_engine import TransformersEngine
    from agentenv.trainer.setup import LoopParts

    parts = LoopParts(load_policy=lambda cfg, **_: (tiny_lm(), None, CharRenderer()),
                      build_engine=lambda cfg, model, tok: TransformersEngine(model, None, max_batch_size=4,
                                                                              seed=cfg.run.seed))
    return train_then_resume(run_dir, OVERRIDES, parts)


def check_against_single_learner(res: dict, run, learner_type: str, initial_model) -> None:
    """Two counted versions, DeepSpeed state in the checkpoint, an exact resume, and every recorded
    update equal to :class:`Learner`'s on the same batch and scores (replayed from ``initial_model``, which
    holds the run's adapters when it trained LoRA)."""
    from agentenv.trainer.checkpoint import latest_checkpoint
    from agentenv.trainer.learners.single import Learner
    from agentenv.trainer.recipe import parse_args
    from agentenv.trajectory import Trajectory

    calls, n_first = res["calls"], res["n_first"]
    first, second = res["summaries"]
    assert first["updates"] == 1 and second["updates"] == 2 and not second["interrupted"]
    assert {c["learner"] for c in calls} == {learner_type}
    stepped = [c for c in calls if c["stepped"]]
    assert [c["version"] for c in stepped] == [1, 2]  # one real optimizer step per counted version
    assert calls[n_first - 1]["stepped"] and calls[-1]["stepped"]
    # the checkpoints hold DeepSpeed's own state, published atomically with the weights
    latest = latest_checkpoint(run / "checkpoints")
    assert latest.name.startswith("v00000002")  # the every-update save, then the final one (v00000002-1)
    meta = json.loads((latest / "meta.json").read_text())
    assert meta["version"] == 2 and "deepspeed/state/mp_rank_00_model_states.pt" in meta["files"]
    assert any(name.endswith("optim_states.pt") for name in meta["files"])

    # the resumed learner starts from exactly the weights the first run ended with
    end_of_first = calls[n_first - 1]["after"]
    start_of_second = calls[n_first]["before"]
    assert all(torch.equal(end_of_first[k], start_of_second[k]) for k in end_of_first)

    # replay every update through the single-process learner: same weights after each one
    cfg, _ = parse_args(["--run-dir", str(run), *OVERRIDES])
    init = initial_model.state_dict()
    reference = Learner(initial_model, cfg.optim, objective=cfg.objective, execution=cfg.learner)
    sent = reference.weights_for_engine()  # the full weights, or with LoRA the adapters alone
    assert set(calls[0]["before"]) == set(sent)
    assert all(torch.equal(calls[0]["before"][k], init[k]) for k in sent)
    for c in calls:
        stats = reference.update([Trajectory.from_dict(d) for d in c["batch"]], scores=c["scores"])
        assert (stats.stepped, stats.version) == (c["stepped"], c["version"])
        if c["stepped"]:
            assert stats.grad_norm == pytest.approx(c["grad_norm"], rel=1e-4)
        ref = reference.weights_for_engine()
        moved = max(float((c["after"][k] - c["before"][k]).abs().max()) for k in ref)
        assert moved > 1e-4 if c["stepped"] else moved == 0.0
        for k in ref:
            assert torch.allclose(c["after"][k], ref[k], atol=2e-6, rtol=1e-5), k


def test_train_with_the_openrlhf_learner_then_resume_matches_the_single_learner(tmp_path):
    run = tmp_path / "run"
    (res,) = run_cpu_data_parallel(functools.partial(_train_and_resume, run_dir=str(run)), world_size=1,
                                   timeout_s=300)
    check_against_single_learner(res, run, "OpenRLHFLearner", tiny_lm())
