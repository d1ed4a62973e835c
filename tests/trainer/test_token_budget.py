"""Token-budget micro-batches over a prefix run once per step: the gradient of the single padded pass."""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import DataError
from agentenv.trainer.batching import build_batch, micro_batch_rows
from agentenv.trainer.learners import forward as forward_module
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner
from agentenv.trajectory import Trajectory

from .conftest import make_trajectories, on_policy, tiny_model
from .test_learner import _grads, _with_system_prompt


def _of_lengths(lengths):
    out = []
    for i, n in enumerate(lengths):
        tr = Trajectory(id=f"r{i}")
        tr.append_environment_tokens([1] * (n - 1))
        tr.append_policy_tokens([2], [-1.0], 0, 0)
        out.append(tr)
    return build_batch(out, 0)


def test_rows_sorted_by_length_and_packed_under_the_budget():
    batch = _of_lengths([5, 9, 3, 9, 7])
    assert micro_batch_rows(batch, 8) == [[0, 1, 2, 3, 4]]
    assert micro_batch_rows(batch, 2) == [[0, 1], [2, 3], [4]]
    # 3+5 padded to 5: 10 tokens; adding the 7 would make 3 * 7 = 21 > 16
    assert micro_batch_rows(batch, 8, 16) == [[2, 0], [4], [1], [3]]
    # a shared prefix of 2 is not run by the micro-batches: rows cost 1, 3, 5, 7, 7 tokens
    assert micro_batch_rows(batch, 8, 16, prefix=2) == [[2, 0, 4], [1, 3]]
    assert micro_batch_rows(batch, 2, 16, prefix=2) == [[2, 0], [4, 1], [3]]
    # a row longer than the budget runs alone
    assert micro_batch_rows(batch, 8, 4) == [[2], [0], [4], [1], [3]]
    with pytest.raises(DataError, match="max_tokens_per_micro_batch must be >= 1"):
        micro_batch_rows(batch, 8, 0)


@pytest.mark.parametrize("objective", ["flash_reinforce", "grpo"])
def test_budgeted_micro_batches_with_one_prefix_pass_give_the_single_pass_gradient(objective, monkeypatch):
    trajs = _with_system_prompt(make_trajectories(8, seed=41, turns=3), 20, seed=41)
    scorer = Learner(tiny_model(41, dtype=torch.float64), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    trajs = on_policy(trajs, scorer.score(trajs), noise=0.3)
    scores = scorer.score(trajs) if objective == "flash_reinforce" else None
    extra = {}
    if objective == "flash_reinforce":  # a gate that rejects some rows, so each row's decision must follow it
        d = scorer.prepare(trajs, scores)[0].gate_d
        extra = dict(delta=float(d.median()), entropy_keep_fraction=0.5)
    common = dict(objective=ObjectiveConfig(name=objective, grpo_group_size=4, **extra))

    plain = Learner(tiny_model(41, dtype=torch.float64), OptimConfig(),
                    execution=LearnerConfig(micro_batch_size=8), **common)
    with monkeypatch.context() as m:  # the prefix not shared: the plain padded pass
        m.setattr(forward_module, "_can_share_prefix", lambda model: False)
        g_plain, _ = _grads(plain, trajs, scores)
    # one pass of all rows, the prefix served from its KV cache within it
    single = Learner(tiny_model(41, dtype=torch.float64), OptimConfig(),
                     execution=LearnerConfig(micro_batch_size=8), **common)
    g_ref, st_ref = _grads(single, trajs, scores)

    prefix_passes, suffix_rows = [], []
    real_prefix, real_suffix = forward_module.SharedPrefix, forward_module._suffix_forward

    class CountedPrefix(real_prefix):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            prefix_passes.append(self.length)

    monkeypatch.setattr(forward_module, "SharedPrefix", CountedPrefix)
    monkeypatch.setattr(forward_module, "_suffix_forward",
                        lambda m, b, p, **k: suffix_rows.append(b.num_rows) or real_suffix(m, b, p, **k))
    budget = LearnerConfig(micro_batch_size=8, max_tokens_per_micro_batch=60)
    split = Learner(tiny_model(41, dtype=torch.float64), OptimConfig(), execution=budget, **common)
    g, st = _grads(split, trajs, scores)

    assert prefix_passes == [20]  # the system prompt ran once for the whole step
    # several micro-batches of several rows (those without an admitted row skip their pass)
    assert len(suffix_rows) >= 2 and max(suffix_rows) >= 2 and sum(suffix_rows) <= 8
    assert st.rows == st_ref.rows == 8 and st.kept_tokens == st_ref.kept_tokens
    if objective == "flash_reinforce":
        assert 0 < st.admitted == st_ref.admitted < 8
    assert st.loss_sum == pytest.approx(st_ref.loss_sum, rel=1e-6)
    assert g.keys() == g_ref.keys()
    for name, ref in g_ref.items():
        torch.testing.assert_close(g[name], ref, rtol=1e-6, atol=1e-12, msg=name)
        # the plain padded pass, up to the cached attention's rounding (about 2e-8 of the largest entry)
        assert float((g[name] - g_plain[name]).abs().max()) <= 1e-6 * float(g_plain[name].abs().max()), name
    # a system-prompt token's embedding gets its gradient only back through the prefix pass
    assert g["model.embed_tokens.weight"][trajs[0].token_ids[0]].abs().sum() > 0


def _frozen_below(model, layers: int):
    """``model`` with its token embedding and first ``layers`` decoder layers taking no gradient."""
    for module in (model.get_input_embeddings(), *model.model.layers[:layers]):
        module.requires_grad_(False)
    return model


def test_a_frozen_bottom_layer_gets_no_gradient_and_the_prefix_pass_still_gives_the_single_pass_gradient(
        monkeypatch):
    trajs = _with_system_prompt(make_trajectories(8, seed=43, turns=2), 20, seed=43)
    scorer = Learner(tiny_model(43, dtype=torch.float64), OptimConfig(), objective=ObjectiveConfig(delta=10.0))
    trajs = on_policy(trajs, scorer.score(trajs), noise=0.3)
    common = dict(objective=ObjectiveConfig(delta=10.0))

    plain = Learner(_frozen_below(tiny_model(43, dtype=torch.float64), 1), OptimConfig(),
                    execution=LearnerConfig(micro_batch_size=8), **common)
    with monkeypatch.context() as m:  # the prefix not shared: the plain padded pass
        m.setattr(forward_module, "_can_share_prefix", lambda model: False)
        g_plain, _ = _grads(plain, trajs)
    shared = Learner(_frozen_below(tiny_model(43, dtype=torch.float64), 1), OptimConfig(),
                     execution=LearnerConfig(micro_batch_size=8, max_tokens_per_micro_batch=60), **common)
    g, _ = _grads(shared, trajs)

    trained = {n for n, p in shared.model.named_parameters() if p.requires_grad}
    assert g.keys() == g_plain.keys() == trained  # every trained weight has a gradient, no frozen one has
    assert all(n.startswith(("model.layers.1.", "model.norm.", "lm_head.")) for n in trained)
    for name, ref in g_plain.items():  # up to the cached attention's rounding
        assert float((g[name] - ref).abs().max()) <= 1e-6 * float(ref.abs().max()), name
    # AdamW holds the trained weights only
    held = {id(p) for group in shared.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for n, p in shared.model.named_parameters() if n in trained}
