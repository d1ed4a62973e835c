"""The OpenRLHF/DeepSpeed learner makes REAL DeepSpeed updates on a CPU (gloo, loopback) and moves
the weights exactly as the single-process learner does on the same batch.

Each case runs in spawned processes (``run_cpu_data_parallel``) so no process group or DeepSpeed
state is left in the pytest process. Budget: about 60 s on a 2-core machine (process start and
imports dominate; each DeepSpeed init takes about 2 s).

Why the comparison is sharp: AdamW's first step is ``lr * g / (|g| + eps)`` per coordinate, which is
nearly ``lr * sign(g)`` with the default eps and would hide a wrongly scaled gradient (a missing
``dp`` factor). With ``adam_eps = 10`` (>> |g|) the step is close to linear in ``g``, so equal
weights after the step mean equal gradients; the pre-clip gradient norms are compared directly too.
Weight decay is 0 here because OpenRLHF exempts biases and norm weights from decay and the
single-process learner does not (a documented difference, see docs/openrlhf.md). A 2-step
warmup makes the two updates use lr/2 then lr, which checks the scheduler DeepSpeed steps.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed: run scripts/install_openrlhf.sh")
pytest.importorskip("openrlhf", reason="needs openrlhf: run scripts/install_openrlhf.sh")

from agentenv.errors import ConfigError, DataError  # noqa: E402
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig  # noqa: E402
from agentenv.trainer.learners.cpu_data_parallel import run_cpu_data_parallel  # noqa: E402
from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig  # noqa: E402
from agentenv.trainer.learners.single import Learner  # noqa: E402

from .conftest import make_trajectories, on_policy, tiny_model  # noqa: E402

pytestmark = pytest.mark.openrlhf

# the learner's three settings, passed as keywords to either backend
OPTIM = dict(optim=OptimConfig(lr=1e-2, adam_eps=10.0, weight_decay=0.0, grad_clip=1.0, warmup_steps=2),
             objective=ObjectiveConfig(delta=1e-3), execution=LearnerConfig(micro_batch_size=1))
GRPO_OPTIM = dict(optim=OptimConfig(lr=1e-2, adam_eps=10.0, weight_decay=0.0, grad_clip=1.0),
                  objective=ObjectiveConfig(name="grpo", grpo_group_size=2),
                  execution=LearnerConfig(micro_batch_size=2))


def _batches():
    """Two fresh batches: 4 rows, then 3 rows (one short of B, so a rank pads a micro-step)."""
    base = tiny_model(0)
    a = make_trajectories(4, seed=1, rewards=[1, 0, 0, 1])
    b = make_trajectories(3, seed=2, rewards=[0, 1, 1])
    learner = Learner(base, **OPTIM)
    # Behaviour log-probs near the model's own, so the gate admits most rows (noise makes rho != 1).
    return on_policy(a, learner.score(a), noise=0.02, seed=3), on_policy(
        b, learner.score(b), noise=0.02, seed=4
    )


def _reference(batches, learner=None):
    """The single-process learner's weights and grad norms after the same updates."""
    learner = learner or Learner(tiny_model(0), **OPTIM)
    norms, stats = [], []
    for batch in batches:
        st = learner.update(batch)
        norms.append(st.grad_norm)
        stats.append(st)
    return learner.weights_for_engine(), norms, stats


def _rank_run(rank: int, batches, zero_stage: int, rows: int, weights_file=None):
    from agentenv.trainer.learners.openrlhf import OpenRLHFLearner

    learner = OpenRLHFLearner(
        tiny_model(0), backend=OpenRLHFBackendConfig(rows_per_update=rows, zero_stage=zero_stage), **OPTIM
    )
    before = learner.weights_for_engine()
    out = []
    for batch in batches:
        st = learner.update(batch)
        out.append((st.version, st.stepped, st.grad_norm, st.objective.admitted, st.objective.rows, st.loss,
                    st.objective.policy_entropy))
    scores = learner.score(batches[0])
    entropy = learner.entropy(batches[0])
    if weights_file is not None:
        learner.weights_for_engine(weights_file)
    return {
        "before": before,
        "after": learner.weights_for_engine(),
        "updates": out,
        "scores": scores,
        "entropy": entropy,
        "gas": learner.gas,
        "world": learner.world_size,
        "engine": type(learner.engine).__name__,
        "optimizer": type(learner.engine.optimizer).__name__,
    }


def _check_against_reference(results, batches):
    ref_w, ref_norms, ref_stats = _reference(batches)
    init = tiny_model(0).state_dict()
    for res in results:
        moved = max(float((res["after"][k] - init[k]).abs().max()) for k in init)
        assert moved > 1e-4, "the DeepSpeed update did not change the weights"
        for k in ref_w:
            assert torch.allclose(res["after"][k], ref_w[k], atol=2e-6, rtol=1e-5), k
        for (version, stepped, norm, admitted, rows, loss, entropy), ref in zip(
            res["updates"], ref_stats, strict=True
        ):
            assert stepped and version == ref.version
            assert norm == pytest.approx(ref.grad_norm, rel=1e-4)
            assert admitted == ref.objective.admitted and rows == ref.objective.rows
            assert loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
            assert entropy == pytest.approx(ref.objective.policy_entropy, rel=1e-5) and entropy > 0
    return ref_norms


def test_world_size_1_zero2_matches_single_process_learner(tmp_path):
    batches = _batches()
    wfile = tmp_path / "w" / "policy.safetensors"
    (res,) = run_cpu_data_parallel(
        functools.partial(_rank_run, batches=batches, zero_stage=2, rows=4, weights_file=str(wfile)),
        world_size=1,
        timeout_s=300,
    )
    from safetensors import safe_open
    from safetensors.torch import load_file

    on_disk = load_file(str(wfile))
    assert set(on_disk) == set(res["after"]) and all(
        torch.equal(on_disk[k], res["after"][k]) for k in on_disk
    )
    with safe_open(str(wfile), "pt") as f:
        assert f.metadata()["version"] == "2"
    assert res["gas"] == 4 and res["world"] == 1  # B=4, micro 1: four accumulated micro-steps
    assert res["engine"] == "DeepSpeedEngine" and "Zero" in res["optimizer"]
    norms = _check_against_reference([res], batches)
    assert all(n > 0 for n in norms)


def test_world_size_2_zero2_gloo_matches_single_process_learner():
    """Two ranks on loopback: each gets half the rows; the 3-row batch leaves rank 1 a padding step."""
    batches = _batches()
    results = run_cpu_data_parallel(
        functools.partial(_rank_run, batches=batches, zero_stage=2, rows=4), world_size=2, timeout_s=300
    )
    assert [r["world"] for r in results] == [2, 2] and results[0]["gas"] == 2
    _check_against_reference(results, batches)
    # Both ranks hold the same weights, and score() gathers every row on both.
    for k in results[0]["after"]:
        assert torch.equal(results[0]["after"][k], results[1]["after"][k])
    for a, b, tr in zip(results[0]["scores"], results[1]["scores"], batches[0], strict=True):
        assert a.shape == (tr.num_policy_tokens,) and torch.equal(a, b)
    # the entropy probe: every rank measures all rows, as the single learner does with the same weights
    single = Learner(tiny_model(0), **OPTIM)
    _reference(batches, single)
    assert results[0]["entropy"] == results[1]["entropy"] == pytest.approx(single.entropy(batches[0]), rel=1e-5)


PREFIX_OPTIM = dict(optim=OptimConfig(lr=1e-2, adam_eps=10.0, weight_decay=0.0, grad_clip=1.0),
                    objective=ObjectiveConfig(delta=10.0),
                    execution=LearnerConfig(micro_batch_size=4, logprob_chunk_tokens=16))


def _prefix_batch():
    from .test_learner import _with_system_prompt

    return _with_system_prompt(make_trajectories(4, seed=5, rewards=[1, 0, 0, 1]), 20, seed=5)


def _rank_prefix_run(rank: int, batch, optim=PREFIX_OPTIM):
    from agentenv.trainer.learners import forward, logprob_chunks
    from agentenv.trainer.learners.openrlhf import OpenRLHFLearner

    prefixes, chunks, kept = [], [], []
    real_prefix, real_chunks = forward.SharedPrefix, forward.chunked_label_logprobs

    class CountedPrefix(real_prefix):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            prefixes.append(self.length)
            if k["leaves"]:  # the update's prefix, back-propagated once (scoring's are not)
                kept.append(self.length)

    forward.SharedPrefix = CountedPrefix
    forward.chunked_label_logprobs = lambda *a, **k: chunks.append(a[4]) or real_chunks(*a, **k)
    assert logprob_chunks.chunked_label_logprobs is real_chunks
    learner = OpenRLHFLearner(tiny_model(0), backend=OpenRLHFBackendConfig(rows_per_update=4, zero_stage=2), **optim)
    st = learner.update(batch)
    return {"after": learner.weights_for_engine(), "norm": st.grad_norm, "prefixes": prefixes, "chunks": chunks,
            "kept": kept, "micro_steps": st.extra["perf/deepspeed_micro_steps"]}


def test_deepspeed_scores_in_chunks_with_the_shared_prefix_run_once():
    """ZeRO-2 runs the single learner's forward: 16-token vocabulary chunks, the 20-token system prompt once."""
    batch = _prefix_batch()
    (res,) = run_cpu_data_parallel(functools.partial(_rank_prefix_run, batch=batch), world_size=1, timeout_s=300)
    assert res["prefixes"] and set(res["prefixes"]) == {20}  # the shared system prompt, one pass per forward
    assert res["chunks"] and set(res["chunks"]) == {16}
    ref = Learner(tiny_model(0), **PREFIX_OPTIM)
    st = ref.update(batch)
    assert res["norm"] == pytest.approx(st.grad_norm, rel=1e-4)
    ref_w = ref.weights_for_engine()
    for k in ref_w:
        assert torch.allclose(res["after"][k], ref_w[k], atol=2e-6, rtol=1e-5), k


def test_two_ranks_take_token_budget_micro_batches_against_one_prefix_pass():
    """ZeRO-2 on two ranks packs rows by a token budget and runs the system prompt once per update.

    Rows hold 32/35 (rank 0) and 33/37 (rank 1) tokens behind a 20-token shared prefix; a budget of
    30 suffix tokens fits rank 0's two rows in one pass (2 x 15) but not rank 1's (2 x 17): rank 0
    runs one zero-weight pass so both take 2 micro-steps, then the prefix's backward as the third.
    """
    optim = {**PREFIX_OPTIM, "execution": replace(PREFIX_OPTIM["execution"], micro_batch_size=2,
                                                  max_tokens_per_micro_batch=30)}
    batch = _prefix_batch()
    results = run_cpu_data_parallel(functools.partial(_rank_prefix_run, batch=batch, optim=optim), world_size=2,
                                    timeout_s=300)
    ref = Learner(tiny_model(0), **optim)
    st = ref.update(batch)
    ref_w = ref.weights_for_engine()
    for res in results:
        assert res["kept"] == [20] and res["micro_steps"] == 3.0
        assert res["norm"] == pytest.approx(st.grad_norm, rel=1e-4)
        for k in ref_w:
            assert torch.allclose(res["after"][k], ref_w[k], atol=2e-6, rtol=1e-5), k


def test_config_errors():
    with pytest.raises(ConfigError):
        OpenRLHFBackendConfig(zero_stage=4)
    with pytest.raises(ConfigError):
        OpenRLHFBackendConfig(param_dtype="int8")
    with pytest.raises(ConfigError):
        OpenRLHFBackendConfig(rows_per_update=6).grad_accumulation_steps(micro_batch_size=4, world_size=1)
    assert OpenRLHFBackendConfig(rows_per_update=8).grad_accumulation_steps(2, 2) == 2


def _rank_bad_input_then_zero0_update(rank: int, batches):
    from agentenv.trainer.learners.openrlhf import OpenRLHFLearner

    learner = OpenRLHFLearner(tiny_model(0), backend=OpenRLHFBackendConfig(rows_per_update=4, zero_stage=0), **OPTIM)
    before = learner.weights_for_engine()
    errors = []
    too_many = make_trajectories(5, seed=5)
    bad = make_trajectories(2, seed=6, rewards=[0, 1])
    bad[1].behaviour_logprobs[-1] = float("nan")
    equal = make_trajectories(2, seed=7, rewards=[1, 1])
    for trs in (too_many, bad):
        try:
            learner.update(trs)
        except DataError as e:
            errors.append(str(e))
    skipped = learner.update(equal)  # all advantages 0: no step, version unchanged
    after = learner.weights_for_engine()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    # the learner survived: real ZeRO-0 updates on the shared batches
    out = []
    for batch in batches:
        st = learner.update(batch)
        out.append((st.version, st.stepped, st.grad_norm, st.objective.admitted, st.objective.rows, st.loss,
                    st.objective.policy_entropy))
    res = {"before": before, "after": learner.weights_for_engine(), "updates": out}
    opt_name = type(learner.engine.optimizer).__name__
    # GRPO through the same backend (a second engine in the same process group), one update
    grpo = OpenRLHFLearner(tiny_model(0), backend=OpenRLHFBackendConfig(rows_per_update=4, zero_stage=2), **GRPO_OPTIM)
    g_stats = grpo.update(batches[0])
    grpo_res = (g_stats.grad_norm, g_stats.objective.clipped_tokens, grpo.weights_for_engine())
    return errors, skipped.stepped, skipped.version, unchanged, res, opt_name, grpo_res


def test_bad_input_is_refused_then_zero0_updates_match():
    batches = _batches()
    ((errors, stepped, version, unchanged, res, opt, grpo_res),) = run_cpu_data_parallel(
        functools.partial(_rank_bad_input_then_zero0_update, batches=batches), world_size=1, timeout_s=300
    )
    assert len(errors) == 2 and "rows_per_update=4" in errors[0] and "traj6-1" in errors[1]
    assert stepped is False and version == 0 and unchanged
    assert opt == "AdamW"  # ZeRO-0 fp32: DeepSpeed steps torch.optim.AdamW directly
    _check_against_reference([res], batches)
    # GRPO (token-mean over the global N, PPO clip) also matches the single-process learner
    ref = Learner(tiny_model(0), **GRPO_OPTIM)
    ref_stats = ref.update(batches[0])
    norm, clipped, weights = grpo_res
    assert (
        norm == pytest.approx(ref_stats.grad_norm, rel=1e-4) and clipped == ref_stats.objective.clipped_tokens
    )
    ref_w = ref.weights_for_engine()
    for k in ref_w:
        assert torch.allclose(weights[k], ref_w[k], atol=2e-6, rtol=1e-5), k


# adapters start at B = 0 and move slowly: a larger step, so that moving and matching are told apart
LORA_OPTIM = {**OPTIM, "optim": replace(OPTIM["optim"], lr=0.5)}


def _adapted_model():
    """``tiny_model(0)`` with rank-4 LoRA adapters on every linear layer, ``A`` drawn from a fixed seed."""
    from agentenv.trainer.learners.lora import add_lora

    model = tiny_model(0)
    torch.manual_seed(7)  # peft draws A from the global generator
    return add_lora(model, rank=4, alpha=8.0, targets=("all-linear",))


def _rank_lora_run(rank: int, batches, zero_stage: int):
    from agentenv.trainer.learners.openrlhf import OpenRLHFLearner

    learner = OpenRLHFLearner(_adapted_model(), backend=OpenRLHFBackendConfig(rows_per_update=4, zero_stage=zero_stage),
                              **LORA_OPTIM)
    norms = [learner.update(batch).grad_norm for batch in batches]
    params = learner.engine.module.parameters()
    return {"sent": learner.weights_for_engine(), "checkpoint": learner.checkpoint_weights(), "norms": norms,
            # ZeRO-3 partitions a tensor: its full size is ds_numel
            "trainable": sum(getattr(p, "ds_numel", p.numel()) for p in params if p.requires_grad)}


@pytest.mark.parametrize("zero_stage, world_size", [(2, 2), (3, 1)])
def test_lora_adapters_train_as_on_the_single_learner(zero_stage, world_size):
    """DeepSpeed trains the adapters only: the same adapters and gradient norms as the single learner after
    two updates, only the adapters sent to the engine, and the frozen base unchanged in the checkpoint."""
    from agentenv.engines.weights import is_adapter_name

    batches = _batches()
    results = run_cpu_data_parallel(functools.partial(_rank_lora_run, batches=batches, zero_stage=zero_stage),
                                    world_size=world_size, timeout_s=300)
    reference = Learner(_adapted_model(), **LORA_OPTIM)
    ref_norms = [reference.update(batch).grad_norm for batch in batches]
    ref_sent = reference.weights_for_engine()
    init = _adapted_model().state_dict()
    # rank 4 on q, k, v, o, gate, up, down of 2 layers (hidden 32, 2 KV heads of 8, MLP 64)
    assert set(ref_sent) == {k for k in init if is_adapter_name(k)} and len(ref_sent) == 2 * 7 * 2
    for res in results:
        assert res["trainable"] == sum(v.numel() for v in ref_sent.values()) == 2 * 4 * (2 * 64 + 2 * 48 + 3 * 96)
        assert set(res["sent"]) == set(ref_sent)
        assert max(float((res["sent"][k] - init[k]).abs().max()) for k in ref_sent) > 1e-3
        for k in ref_sent:
            assert torch.allclose(res["sent"][k], ref_sent[k], atol=2e-6, rtol=1e-5), k
        assert res["norms"] == pytest.approx(ref_norms, rel=1e-4)
        assert set(res["checkpoint"]) == set(init)
        for k, v in init.items():
            assert torch.equal(res["checkpoint"][k], res["sent"][k] if k in ref_sent else v), k
