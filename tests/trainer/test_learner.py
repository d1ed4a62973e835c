"""The single-process learner on tiny random Llama/Qwen2 models."""

from __future__ import annotations

import math
import os
import tempfile
import threading
import time

import pytest
import torch
import torch.multiprocessing as mp

from agentenv.engines.sampling import SamplingTransform
from agentenv.errors import ConfigError, DataError
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trajectory import Trajectory

from .conftest import VOCAB, make_trajectories, on_policy, tiny_model


def _manual_logprobs(model, tr: Trajectory) -> torch.Tensor:
    ids = torch.tensor([tr.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].double()
    lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
    return lp[torch.tensor(tr.loss_mask[1:], dtype=torch.bool)].float()


def _grads(learner, trajs, scores=None):
    learner.optimizer.zero_grad(set_to_none=True)
    batch, adm = learner.prepare(trajs, scores)
    stats = learner.backward(batch, adm)
    return {n: p.grad.clone() for n, p in learner.model.named_parameters() if p.grad is not None}, stats


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_score_matches_unpadded_forward(arch):
    model = tiny_model(1, arch)
    trajs = make_trajectories(5, seed=1)
    learner = Learner(model, OptimConfig(), execution=LearnerConfig(micro_batch_size=2))
    scores = learner.score(trajs)
    for tr, s in zip(trajs, scores, strict=True):
        assert s.shape == (tr.num_policy_tokens,)
        torch.testing.assert_close(s, _manual_logprobs(model, tr), rtol=1e-5, atol=1e-5)
        # no autograd graph: a kept score must not hold its micro-batch's activations (PACE keeps them)
        assert s.grad_fn is None and not s.requires_grad


# the method; the constant normaliser with truncated importance sampling (C = 1.02 caps some of the ratios
# of on_policy(noise=0.05), checked below)
@pytest.mark.parametrize("options", [{}, {"loss_aggregation": "constant", "loss_constant": 20, "is_truncation": 1.02}])
def test_gradient_matches_hand_written_loss_and_ignores_micro_batching(options):
    model = tiny_model(2)
    objective = {k: v for k, v in options.items() if k != "loss_constant"}
    learner = Learner(model, OptimConfig(),
                      objective=ObjectiveConfig(delta=10.0, **objective), loss_constant=options.get("loss_constant"),
                      execution=LearnerConfig(micro_batch_size=8))
    trajs = make_trajectories(8, seed=2)
    trajs = on_policy(trajs, learner.score(trajs), noise=0.05)
    g8, st8 = _grads(learner, trajs)
    # the hand-written loss on unpadded sequences
    model.zero_grad()
    rewards = torch.tensor([t.reward for t in trajs])
    adv = rewards - rewards.mean()
    total, capped = 0.0, 0
    for i, tr in enumerate(trajs):
        ids = torch.tensor([tr.token_ids])
        logits = model(input_ids=ids).logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(1, ids[0, 1:, None])[:, 0]
        m = torch.tensor(tr.loss_mask[1:], dtype=torch.bool)
        blp = torch.tensor(tr.behaviour_logprobs[1:])[m]
        rho = torch.exp(lp[m].detach() - blp)
        capped += int((rho > options.get("is_truncation", math.inf)).sum())
        rho = rho.clamp(max=options.get("is_truncation", math.inf))
        norm = options.get("loss_constant", int(m.sum()))  # K, or the sample mean's T_i
        total = total - adv[i] / (len(trajs) * norm) * (rho * lp[m]).sum()
    total.backward()
    assert (capped > 0) == ("is_truncation" in options)
    for n, p in model.named_parameters():
        torch.testing.assert_close(g8[n], p.grad, rtol=1e-4, atol=1e-7)
    for mbs in (1, 3):
        learner.execution = LearnerConfig(micro_batch_size=mbs)
        if mbs == 3:  # activation checkpointing recomputes, it does not change the gradient
            from agentenv.trainer.learners.forward import enable_gradient_checkpointing

            enable_gradient_checkpointing(model)
            assert model.model.gradient_checkpointing
        g, st = _grads(learner, trajs)
        for n in g8:
            torch.testing.assert_close(g[n], g8[n], rtol=1e-4, atol=1e-7)
        assert st.loss_sum == pytest.approx(st8.loss_sum, rel=1e-5)
        assert st.admitted == st8.admitted == 8


def _rank_worker(rank, world, init_file, out_dir, trajs_dicts):
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        torch.set_num_threads(1)
        learner = Learner(tiny_model(3), OptimConfig(),
                          objective=ObjectiveConfig(delta=10.0),
                          execution=LearnerConfig(micro_batch_size=2))
        trajs = [Trajectory.from_dict(d) for d in trajs_dicts]
        learner.optimizer.zero_grad(set_to_none=True)
        batch, adm = learner.prepare(trajs)
        stats = learner.backward(batch, adm)
        from agentenv.trainer.learners.single import _all_reduce_grads, _all_reduce_stats

        _all_reduce_grads(learner._params)
        stats = _all_reduce_stats(stats)
        grads = {n: p.grad for n, p in learner.model.named_parameters()}
        res = {"grads": grads, "loss": stats.loss_sum, "rows": stats.rows}
        torch.save(res, os.path.join(out_dir, f"r{rank}.pt"))
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.timeout(180)
def test_two_ranks_gloo_equal_one_rank():
    trajs = make_trajectories(7, seed=3)  # 7 rows: shards of 4 and 3
    ref = Learner(tiny_model(3), OptimConfig(),
                  objective=ObjectiveConfig(delta=10.0),
                  execution=LearnerConfig(micro_batch_size=7))
    g1, st1 = _grads(ref, trajs)
    with tempfile.TemporaryDirectory() as d:
        args = (2, os.path.join(d, "init"), d, [t.to_dict() for t in trajs])
        # fork: a spawned child re-imports torch+transformers (~15 s each on 2 cores)
        mp.start_processes(_rank_worker, args=args, nprocs=2, start_method="fork")
        for r in (0, 1):
            res = torch.load(os.path.join(d, f"r{r}.pt"))
            assert res["rows"] == 7
            assert res["loss"] == pytest.approx(st1.loss_sum, rel=1e-5)
            for n in g1:
                torch.testing.assert_close(res["grads"][n], g1[n], rtol=1e-4, atol=1e-7)


def test_update_steps_version_and_weights_for_engine(tmp_path):
    model = tiny_model(4)
    learner = Learner(model, OptimConfig(lr=1e-3),
                      objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=3))
    trajs = make_trajectories(6, seed=4, rewards=[1, 0, 1, 0, 0, 1])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st = learner.update(trajs, scores=learner.score(trajs))
    assert st.stepped and st.version == learner.version == 1
    assert st.rows == 6 and st.grad_norm > 0 and math.isfinite(st.loss)
    assert st.objective.admitted == 6 and st.objective.advantage_mean == pytest.approx(0.0, abs=1e-7)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    m = st.to_metrics()
    assert m["train/version"] == 1 and m["gate/admitted_fraction"] == 1.0
    assert st.to_dict()["admitted_fraction"] == 1.0 and st.to_dict()["loss"] == st.loss
    sd = learner.weights_for_engine()
    fresh = tiny_model(99)
    fresh.load_state_dict(sd)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v)
    path = learner.weights_for_engine(tmp_path / "w.safetensors")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(path))["lm_head.weight"], model.state_dict()["lm_head.weight"])


def test_with_shared_weights_the_step_and_the_new_version_wait_for_a_read_in_progress():
    """An engine decoding the learner's parameters in place never reads them half-stepped."""
    model = tiny_model(4)
    learner = Learner(model, OptimConfig(lr=1e-3), objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=3))
    trajs = make_trajectories(6, seed=4, rewards=[1, 0, 1, 0, 0, 1])
    shared = learner.share_weights()
    assert learner.share_weights() is shared and shared.version == 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with shared.reading() as version:  # a decoding step in progress
        update = threading.Thread(target=learner.update, args=(trajs,))
        update.start()
        deadline = time.monotonic() + 60
        while not shared._writers_waiting:  # the gradient is computed; the step waits
            assert time.monotonic() < deadline and update.is_alive()
            time.sleep(0.005)
        assert version == 0 and learner.version == 0
        assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    update.join(60)
    assert learner.version == shared.version == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    with shared.reading() as version:
        assert version == 1


def test_update_reduces_loss_on_repeated_batch():
    model = tiny_model(5)
    learner = Learner(model, OptimConfig(lr=3e-3, weight_decay=0.0),
                      objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=4))
    trajs = make_trajectories(4, seed=5, rewards=[1, 0, 0, 0])
    win = trajs[0]
    lp0 = learner.score([win])[0].mean()
    for _ in range(5):
        learner.update(trajs)
    assert learner.score([win])[0].mean() > lp0 + 0.05  # the rewarded trajectory got more likely
    assert learner.version == 5


def test_all_rejected_is_skipped_and_training_continues():
    model = tiny_model(6)
    learner = Learner(model, OptimConfig(lr=1e-3), objective=ObjectiveConfig(delta=1e-3))
    trajs = make_trajectories(4, seed=6, rewards=[1, 0, 1, 0])  # random behaviour log-probs: far off-policy
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st = learner.update(trajs, scores=learner.score(trajs))
    assert not st.stepped and st.version == 0 and st.objective.admitted == 0 and st.grad_norm == 0.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    st = learner.update(trajs)  # gate on the training forward: same decision
    assert not st.stepped and st.objective.admitted == 0
    # on-policy batch is admitted and steps
    good = on_policy(trajs, learner.score(trajs))
    st = learner.update(good, scores=learner.score(good))
    assert st.stepped and st.version == 1 and st.objective.admitted == 4
    # opting in to a step on a zero gradient: weight decay moves the weights, version counts it
    learner2 = Learner(model, OptimConfig(lr=1e-3, step_on_zero_gradient=True))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    st = learner2.update(trajs)
    assert st.stepped and st.version == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_equal_rewards_zero_gradient_skip():
    learner = Learner(tiny_model(7), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    trajs = make_trajectories(3, seed=7, rewards=[1, 1, 1])
    g, _ = _grads(learner, trajs)
    assert all(not v.any() for v in g.values())
    calls = []
    hook = learner.model.register_forward_hook(lambda *_: calls.append(1))
    stats = learner.update(trajs)  # every advantage 0: no gradient whatever the policy, so no forward at all
    hook.remove()
    assert not stats.stepped and calls == []
    assert stats.objective.rows == 3 and stats.objective.admitted == 0 and stats.objective.kept_tokens == 0
    assert math.isnan(stats.to_metrics()["gate/mean_d"])  # the gate was not evaluated, and says so
    nll = -sum(lp for t in trajs for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True) if m)
    assert stats.to_metrics()["train/behaviour_entropy"] == pytest.approx(nll / stats.objective.tokens)


def _manual_entropies(model, tr: Trajectory) -> torch.Tensor:
    """Exact entropy (nats) of the model's next-token distribution at each policy-token label, unpadded."""
    ids = torch.tensor([tr.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
    ent = -(logp.exp() * logp).sum(-1)
    return ent[torch.tensor(tr.loss_mask[1:], dtype=torch.bool)]


@pytest.mark.parametrize("micro", [8, 3])
def test_policy_entropy_is_the_exact_entropy_over_the_scored_tokens(micro):
    model = tiny_model(11)
    learner = Learner(model, OptimConfig(),
                      objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=micro))
    trajs = make_trajectories(6, seed=11, rewards=[1, 0, 1, 0, 0, 1])
    expected = torch.cat([_manual_entropies(model, t) for t in trajs])
    # the entropy probe's measure: the same mean, with no gradient, the weights and the mode left alone
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert learner.entropy(trajs) == pytest.approx(float(expected.mean()), rel=1e-5)
    assert model.training and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    stats = learner.update(trajs)
    assert stats.objective.entropy_tokens == expected.numel() == stats.objective.tokens
    assert stats.to_metrics()["train/policy_entropy"] == pytest.approx(float(expected.mean()), rel=1e-5)
    # not the sample estimate -log mu of the stored behaviour log-probabilities
    assert stats.to_metrics()["train/policy_entropy"] != pytest.approx(stats.to_metrics()["train/behaviour_entropy"])
    # a batch whose advantages are all 0 runs no forward pass: nothing scored, the entropy is not measured
    flat = learner.update(make_trajectories(3, seed=12, rewards=[1, 1, 1]))
    assert flat.objective.entropy_tokens == 0 and math.isnan(flat.to_metrics()["train/policy_entropy"])


def test_entropy_is_measured_under_the_samplers_transform():
    # a head of zeros gives equal logits everywhere: the entropy is log V
    flat = tiny_model(14)
    with torch.no_grad():
        flat.lm_head.weight.zero_()
    trajs = make_trajectories(3, seed=14)
    assert Learner(flat, OptimConfig(),
                   objective=ObjectiveConfig(delta=10.0)).entropy(trajs) == pytest.approx(math.log(VOCAB), rel=1e-6)
    # temperature 0.7 and the top 5 tokens, by hand: softmax(logits / 0.7) over the 5 largest logits and
    # the sampled token (always in the kept set, as the engine sampled it: here a random one, often not)
    model = tiny_model(15)
    hand = []
    for tr in trajs:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([tr.token_ids])).logits[0, :-1].double() / 0.7
        drop = logits < logits.topk(5, dim=-1).values[:, -1:]
        drop[torch.arange(len(tr.token_ids) - 1), torch.tensor(tr.token_ids[1:])] = False
        logp = torch.log_softmax(logits.masked_fill(drop, float("-inf")), -1)
        ent = torch.special.entr(logp.exp()).sum(-1)
        hand.append(ent[torch.tensor(tr.loss_mask[1:], dtype=torch.bool)])
    top5 = Learner(model, OptimConfig(),
                   objective=ObjectiveConfig(delta=10.0),
                   sampling=SamplingTransform(temperature=0.7, top_k=5))
    expected = float(torch.cat(hand).mean())
    assert top5.entropy(trajs) == pytest.approx(expected, rel=1e-5) and expected < math.log(6) + 1e-9


def test_bad_input_errors_name_the_trajectory():
    learner = Learner(tiny_model(8), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    with pytest.raises(DataError, match="empty batch"):
        learner.update([])
    trajs = make_trajectories(3, seed=8)
    j = trajs[1].loss_mask.index(1)
    trajs[1].behaviour_logprobs[j] = float("nan")
    with pytest.raises(DataError, match=trajs[1].id):
        learner.update(trajs)
    trajs = make_trajectories(3, seed=8)
    with pytest.raises(DataError, match="scores"):
        learner.update(trajs, scores=[torch.zeros(1)] * 3)
    # NaN in the current policy's log-probs (broken weights): named, and nothing stepped
    with torch.no_grad():
        learner.model.lm_head.weight[5, 0] = float("nan")
    with pytest.raises(DataError, match=r"trajectory traj8-\d"):
        learner.update(trajs)
    with pytest.raises(DataError, match=r"trajectory traj8-\d"):
        learner.score(trajs)
    assert learner.version == 0


def test_trajectory_without_policy_tokens_is_excluded():
    learner = Learner(tiny_model(9), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    trajs = make_trajectories(3, seed=9, rewards=[1, 0, 0])
    empty = Trajectory(id="empty", reward=1.0)
    empty.append_environment_tokens([1, 2, 3])
    st = learner.update(trajs + [empty])
    assert st.excluded_rows == 1 and st.rows == 3 and st.objective.excluded_rows == 1
    assert st.reward_mean == pytest.approx(1 / 3)
    assert learner.score(trajs + [empty])[3].shape == (0,)


def test_grpo_config_and_update():
    with pytest.raises(ConfigError, match="n = 1"):
        ObjectiveConfig(name="grpo", grpo_group_size=1)
    with pytest.raises(ConfigError):
        ObjectiveConfig(name="ppo")
    model = tiny_model(10)
    learner = Learner(model, OptimConfig(),
                      objective=ObjectiveConfig(name="grpo", grpo_group_size=2),
                      execution=LearnerConfig(micro_batch_size=3))
    trajs = make_trajectories(4, seed=10, rewards=[1, 0, 0, 0])
    trajs = on_policy(trajs, learner.score(trajs))
    g, st = _grads(learner, trajs)
    # on-policy (ratio 1, nothing clipped): grad of -(1/N) sum A_i lp_it with group-normalised A
    model.zero_grad()
    a = torch.tensor([1 / (math.sqrt(0.5) + 1e-6), -1 / (math.sqrt(0.5) + 1e-6), 0.0, 0.0]) * 0.5
    n_tok = sum(t.num_policy_tokens for t in trajs)
    total = 0.0
    for i, tr in enumerate(trajs):
        ids = torch.tensor([tr.token_ids])
        lp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1).gather(1, ids[0, 1:, None])[:, 0]
        m = torch.tensor(tr.loss_mask[1:], dtype=torch.bool)
        total = total - a[i] * lp[m].sum() / n_tok
    total.backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(g[n], p.grad, rtol=1e-4, atol=1e-7)
    assert st.clipped_tokens == 0
    assert learner.update(trajs).stepped
    with pytest.raises(DataError, match="whole number"):
        learner.update(trajs[:3])


def test_entropy_filter_runs_in_learner():
    learner = Learner(tiny_model(11), OptimConfig(), objective=ObjectiveConfig(delta=10.0, entropy_keep_fraction=0.5))
    trajs = make_trajectories(4, seed=11, rewards=[1, 0, 0, 0])
    _, st = _grads(learner, trajs)
    failed_tokens = sum(t.num_policy_tokens for t in trajs[1:])
    kept_failed = sum(math.ceil(0.5 * t.num_policy_tokens) for t in trajs[1:])
    won = trajs[0].num_policy_tokens
    assert st.kept_tokens == won + kept_failed < won + failed_tokens


def test_score_and_gate_follow_positions_not_ids():
    learner = Learner(tiny_model(12), OptimConfig(),
                      objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=2))
    a, b = make_trajectories(2, seed=12)
    b.id = a.id  # ids need not be unique
    empty = Trajectory(id=a.id)
    empty.append_environment_tokens([1, 2])
    s = learner.score([a, empty, b])
    assert s[1].shape == (0,)
    torch.testing.assert_close(s[0], _manual_logprobs(learner.model, a), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s[2], _manual_logprobs(learner.model, b), rtol=1e-5, atol=1e-5)
    batch, adm = learner.prepare([a, empty, b], s)
    assert batch.source_index == (0, 2) and adm.tolist() == [True, True]


def test_token_logprobs_projects_only_policy_positions_with_the_same_values():
    from agentenv.trainer.batching import build_batch
    from agentenv.trainer.learners.forward import token_logprobs

    model = tiny_model(13)

    class NoLogitsToKeep(torch.nn.Module):  # a causal LM without the argument: full projection
        def forward(self, input_ids, attention_mask):
            return model(input_ids=input_ids, attention_mask=attention_mask)

    batch = build_batch(make_trajectories(4, seed=13), 0)
    m = batch.loss_mask
    assert 0 < int(m.any(0).sum()) < m.shape[1]  # some positions are skipped
    lp, ent = token_logprobs(model, batch, with_entropy=True)
    lp_full, ent_full = token_logprobs(NoLogitsToKeep(), batch, with_entropy=True)
    assert lp.shape == lp_full.shape == ent.shape == m.shape
    torch.testing.assert_close(lp[m], lp_full[m], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent[m], ent_full[m], rtol=1e-5, atol=1e-6)
    skipped = ~m.any(0)
    assert (lp[:, skipped] == 0).all() and (ent[:, skipped] == 0).all()
    assert (lp_full[:, skipped] != 0).any()


def _with_system_prompt(trajs, n: int, seed: int) -> list[Trajectory]:
    """Copies of ``trajs`` that all start with the same ``n`` environment tokens (a system prompt)."""
    import random

    rng = random.Random(seed)
    system = [rng.randrange(1, 60) for _ in range(n)]
    out = []
    for tr in trajs:
        d = tr.to_dict()
        d["token_ids"] = system + list(d["token_ids"])
        d["loss_mask"] = [False] * n + list(d["loss_mask"])
        d["behaviour_logprobs"] = [0.0] * n + list(d["behaviour_logprobs"])
        d["prompt_length"] = d["prompt_length"] + n
        out.append(Trajectory.from_dict(d))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prefix_pass_gives_the_plain_values_and_gradient(arch, monkeypatch):
    """The system prompt all rows share runs once; log pi, the loss and the gradient do not change."""
    from agentenv.trainer.batching import build_batch
    from agentenv.trainer.learners import forward as forward_module
    from agentenv.trainer.learners.forward import shared_prefix_length

    calls = []
    real = forward_module._suffix_forward
    monkeypatch.setattr(forward_module, "_suffix_forward", lambda *a, **k: calls.append(a[2].length) or real(*a, **k))

    trajs = _with_system_prompt(make_trajectories(6, seed=21), 24, seed=21)
    # rows share exactly the 24 system tokens (their own prompts differ right after)
    assert shared_prefix_length(build_batch(trajs, 0)) == 24
    plain, shared = (Learner(tiny_model(21, arch), OptimConfig(), objective=ObjectiveConfig(delta=10.0),
                             execution=LearnerConfig(micro_batch_size=6)) for _ in range(2))

    def plain_pass(fn, *args):  # the prefix not shared: the plain padded pass
        with monkeypatch.context() as m:
            m.setattr(forward_module, "_can_share_prefix", lambda model: False)
            return fn(*args)

    trajs = on_policy(trajs, plain_pass(plain.score, trajs), noise=0.05)
    for a, b in zip(plain_pass(plain.score, trajs), shared.score(trajs), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    g_plain, st_plain = plain_pass(_grads, plain, trajs)
    g_shared, st_shared = _grads(shared, trajs)
    assert st_shared.loss_sum == pytest.approx(st_plain.loss_sum, rel=1e-5, abs=1e-7)
    assert g_plain.keys() == g_shared.keys()
    for name, g in g_plain.items():
        torch.testing.assert_close(g_shared[name], g, rtol=1e-4, atol=1e-6, msg=name)
    # the embedding of a system-prompt token gets gradient only through the prefix's repeated KV
    emb = "model.embed_tokens.weight"
    assert g_shared[emb][trajs[0].token_ids[0]].abs().sum() > 0
    assert calls == [24, 24]  # one scoring pass and one training pass took the shared path
    # activation checkpointing drops the KV cache in training: the plain pass runs instead
    calls.clear()
    ckpt = Learner(tiny_model(21, arch), OptimConfig(),
                   objective=ObjectiveConfig(delta=10.0),
                   execution=LearnerConfig(micro_batch_size=6, gradient_checkpointing=True))
    g_ckpt, _ = _grads(ckpt, trajs)
    assert calls == []
    torch.testing.assert_close(g_ckpt[emb], g_plain[emb], rtol=1e-4, atol=1e-6)


def test_shared_prefix_length_stops_at_the_first_policy_token_and_differing_tokens():
    from agentenv.trainer.batching import build_batch
    from agentenv.trainer.learners.forward import shared_prefix_length

    a = Trajectory(id="a")
    a.append_environment_tokens([5, 6, 7, 8])
    a.append_policy_tokens([9, 10], [-1.0, -1.0], 0, 0)
    b = Trajectory(id="b")
    b.append_environment_tokens([5, 6, 7, 8])
    b.append_policy_tokens([9, 11, 12], [-1.0, -1.0, -1.0], 0, 0)
    # label 3 (predicting token 4, the first policy token) needs position 3's output: prefix 3
    assert shared_prefix_length(build_batch([a, b], 0)) == 3
    c = Trajectory(id="c")
    c.append_environment_tokens([5, 6, 1, 8, 2])
    c.append_policy_tokens([9], [-1.0], 0, 0)
    assert shared_prefix_length(build_batch([a, c], 0)) == 2
    assert shared_prefix_length(build_batch([a], 0)) == 0
