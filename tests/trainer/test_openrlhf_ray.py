"""The Ray-actor path of the OpenRLHF backend on a CPU: two Ray actors (OpenRLHF's rendezvous code),
gloo on 127.0.0.1, ZeRO-2, two real updates that move the weights exactly as the single-process
learner does. Marked ``slow``: starting Ray and two actor processes takes 30-70 s on 2 cores.

Ray runs on loopback only (``_node_ip_address="127.0.0.1"``, rendezvous address 127.0.0.1).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="needs ray: run scripts/install_openrlhf.sh")
pytest.importorskip("deepspeed", reason="needs deepspeed: run scripts/install_openrlhf.sh")
pytest.importorskip("openrlhf", reason="needs openrlhf: run scripts/install_openrlhf.sh")

from .conftest import tiny_model  # noqa: E402
from .test_openrlhf_backend import OPTIM, _batches, _reference  # noqa: E402

pytestmark = [pytest.mark.openrlhf, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def test_ray_learner_group_two_cpu_actors_match_single_process_learner(monkeypatch):
    import ray

    from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig
    from agentenv.trainer.learners.ray_group import RayLearnerGroup

    # the actors unpickle the model factory from tests.trainer.conftest: give them the repo on the path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    batches = _batches()
    ray.init(
        num_cpus=2, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False
    )
    try:
        group = RayLearnerGroup(
            functools.partial(tiny_model, 0),
            backend=OpenRLHFBackendConfig(rows_per_update=4, zero_stage=2),
            world_size=2,
            num_gpus_per_actor=0,
            master_addr="127.0.0.1",
            **OPTIM,
        )
        stats = [group.update(b) for b in batches]
        weights = group.weights_for_engine()
        version = group.version
        scores = group.score(batches[0])
    finally:
        ray.shutdown()
    ref_w, ref_norms, _ = _reference(batches)
    assert version == 2 and all(s.stepped for s in stats)
    assert [s.grad_norm for s in stats] == pytest.approx(ref_norms, rel=1e-4)
    init = tiny_model(0).state_dict()
    assert max(float((weights[k] - init[k]).abs().max()) for k in init) > 1e-4
    for k in ref_w:
        assert torch.allclose(weights[k], ref_w[k], atol=2e-6, rtol=1e-5), k
    assert [s.shape[0] for s in scores] == [tr.num_policy_tokens for tr in batches[0]]
