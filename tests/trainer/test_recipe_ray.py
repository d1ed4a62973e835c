"""``agentenv train`` with ``learner.backend: ray``: two CPU Ray actors (gloo, ZeRO-2) as the learner
of the recipe's ``train()``, a checkpoint written by both actors, a ``--resume`` into fresh actors, and
every update equal to the single-process learner's (the checks of ``test_recipe_openrlhf.py``).

The policy is a tiny random Llama saved with the default tokenizer, so the driver (engine, renderer)
and the actors (``learners.backends.actor_model``) load the same weights by ``model.name``. Ray runs on
loopback only. Budget: about 60 s on 2 cores (four actor processes start; imports dominate).
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray", reason="needs ray: run scripts/install_openrlhf.sh")
pytest.importorskip("deepspeed", reason="needs deepspeed: run scripts/install_openrlhf.sh")
pytest.importorskip("openrlhf", reason="needs openrlhf: run scripts/install_openrlhf.sh")

from .test_recipe_openrlhf import OVERRIDES, check_against_single_learner, train_then_resume  # noqa: E402

pytestmark = [pytest.mark.openrlhf, pytest.mark.slow]


LORA = ["learner.lora_rank=4", "learner.lora_alpha=8"]


@pytest.mark.parametrize("lora", [[], LORA], ids=["full weights", "lora adapters"])
def test_train_with_two_ray_learner_actors_then_resume_matches_the_single_learner(tmp_path, lora):
    """With LoRA, both actors start from the driver's adapters and only the adapters reach the engine."""
    import ray

    from agentenv.models import load_model_and_tokenizer, tiny_random_model

    folder = tmp_path / "tiny"
    _, tokenizer = load_model_and_tokenizer(None)
    tiny_random_model(hidden_size=32, max_position_embeddings=256).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    overrides = [o for o in OVERRIDES if not o.startswith("learner.backend")] + [
        "learner.backend=ray", "learner.world_size=2", f"model.name={folder}",
        "rollout.max_total_tokens=32", "rollout.max_new_tokens_per_turn=6", *lora,
    ]
    ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        res = train_then_resume(str(tmp_path / "run"), overrides)
    finally:
        ray.shutdown()
    initial = load_model_and_tokenizer(folder)[0]
    if lora:  # the adapters the run started from (A drawn in the driver), over the same base
        from agentenv.engines.weights import is_adapter_name
        from agentenv.trainer.learners.lora import add_lora

        start = res["calls"][0]["before"]
        assert start and all(is_adapter_name(k) for k in start)  # only the adapters were sent
        add_lora(initial, rank=4, alpha=8.0, targets=("all-linear",))
        assert not initial.load_state_dict(start, strict=False).unexpected_keys
    check_against_single_learner(res, tmp_path / "run", "RayLearnerGroup", initial)
