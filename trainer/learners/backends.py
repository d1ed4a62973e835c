"""The training recipe's learner, built for ``learner.backend``: one process, DeepSpeed, or Ray actors.

Every backend has the interface the recipe uses: ``score(trajectories)``, ``update(trajectories,
scores=)`` (exactly one optimizer step per fresh batch), ``version`` (optimizer steps taken),
``weights_for_engine()`` and ``save(root, ...)`` / ``restore(root)`` for
:class:`agentenv.trainer.checkpoint.CheckpointManager`.

=========  ==========================================================  ================================
backend    runs                                                        scale
=========  ==========================================================  ================================
single     :class:`agentenv.trainer.learners.single.Learner` in this process   CPU or one GPU
openrlhf   :class:`~agentenv.trainer.learners.openrlhf.OpenRLHFLearner`  one process: gloo on a CPU, NCCL
           (OpenRLHF's DeepSpeed strategy, ZeRO ``zero_stage``)         and bf16 on one GPU
ray        :class:`~agentenv.trainer.learners.ray_group.RayLearnerGroup`  ``world_size`` actors (GPUs), one
           (one ``OpenRLHFLearner`` rank per Ray actor)                 node or a Ray cluster
=========  ==========================================================  ================================

The DeepSpeed backends build the DeepSpeed batch geometry from the recipe: ``train_batch_size`` =
``run.batch_size`` (B) and ``micro_train_batch_size`` = ``learner.micro_batch_size`` (checked by
:class:`agentenv.trainer.config.TrainConfig`). They need ``scripts/install_openrlhf.sh``.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
from typing import Any

import torch

from agentenv.engines.sampling import SamplingTransform
from agentenv.errors import ConfigError
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.learners.contract import PolicyLearner

__all__ = ["build_learner", "backend_config", "loss_constant", "sampling_transform"]

logger = logging.getLogger(__name__)


def backend_config(cfg: TrainConfig) -> Any:
    """The :class:`~agentenv.trainer.learners.deepspeed_strategy.OpenRLHFBackendConfig` of a DeepSpeed backend.

    Raises:
        ConfigError: OpenRLHF/DeepSpeed are not installed.
    """
    from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig

    return OpenRLHFBackendConfig(
        rows_per_update=cfg.run.batch_size, zero_stage=cfg.learner.zero_stage,
        param_dtype=cfg.learner.param_dtype, seed=cfg.run.seed,
    )


def sampling_transform(cfg: TrainConfig) -> SamplingTransform:
    """The behaviour transform of the run's rollouts (``rollout.temperature``, ``top_p``, ``top_k``).

    Every learner backend scores log pi under it, the processing the engine applied to log mu.

    Raises:
        ConfigError: a setting the transform refuses (temperature <= 0, top_p outside (0, 1], negative
            top_k); :class:`TrainConfig` already refuses these when it is built.
    """
    r = cfg.rollout
    return SamplingTransform(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)


def loss_constant(cfg: TrainConfig) -> int | None:
    """``K`` of ``objective.loss_aggregation: constant`` (policy tokens), None under any other aggregation.

    ``K`` is the rollout's policy-token budget per trajectory
    (:attr:`agentenv.rollout.episode.RolloutConfig.policy_token_budget`).
    """
    return cfg.rollout.policy_token_budget if cfg.objective.loss_aggregation == "constant" else None


def build_learner(cfg: TrainConfig, model: torch.nn.Module, *, warmed_up: bool = False) -> PolicyLearner:
    """The learner ``cfg.learner`` names, on ``model`` (policy version 0).

    Args:
        cfg: The run's config (``learner``, ``optim``, ``objective``, ``run.batch_size``, ``model``; ``rollout``'s
            temperature, top_p and top_k become the learner's :class:`SamplingTransform`).
        model: The loaded policy. With ``learner.lora_rank``, LoRA adapters are added to it in place first
            (:func:`agentenv.trainer.learners.lora.add_lora`), so the engine's copy has them too. ``single``
            trains it in place, ``openrlhf`` a copy; ``ray`` actors load their own copy (by ``model.name``,
            on their GPU) and, when ``warmed_up``, receive this model's weights instead (the warm-up exists
            only in this process), then this model's adapters.
        warmed_up: ``model`` differs from the checkpoint on disk (the cached tool-use warm-up).

    Raises:
        ConfigError: OpenRLHF, DeepSpeed or Ray missing, an inconsistent DeepSpeed geometry, or a LoRA
            target the model does not have.
    """
    backend = cfg.learner.backend
    # the warm-up's weights for Ray actors, which load the base model themselves (adapters added below)
    base_state = None
    if backend == "ray" and warmed_up:
        base_state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    if cfg.learner.lora_rank:  # adapters added in place: the engine's copy of ``model`` gets them too
        from agentenv.trainer.learners.lora import add_lora

        add_lora(model, **lora_settings(cfg))
    if backend == "single":
        from agentenv.trainer.learners.single import Learner

        return Learner(model, cfg.optim, objective=cfg.objective, execution=cfg.learner,
                       sampling=sampling_transform(cfg), total_steps=cfg.run.updates, loss_constant=loss_constant(cfg))
    if backend == "openrlhf":
        from agentenv.trainer.learners.openrlhf import OpenRLHFLearner

        # DeepSpeed takes over (and may cast or partition) the module it is given: hand it its own
        # copy, so ``model`` stays a plain module the caller can copy for the generation engine.
        return OpenRLHFLearner(
            copy.deepcopy(model), cfg.optim, backend_config(cfg), objective=cfg.objective,
            execution=cfg.learner, sampling=sampling_transform(cfg),
            total_steps=cfg.run.updates, loss_constant=loss_constant(cfg),
        )
    return _ray_group(cfg, model, base_state=base_state)


def lora_settings(cfg: TrainConfig) -> dict[str, Any]:
    """:func:`agentenv.trainer.learners.lora.add_lora`'s keyword arguments from the ``learner`` section."""
    return {"rank": cfg.learner.lora_rank, "alpha": cfg.learner.lora_alpha, "targets": cfg.learner.lora_target_modules}


def _ray_group(cfg: TrainConfig, model: torch.nn.Module, *,
               base_state: dict[str, torch.Tensor] | None) -> PolicyLearner:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("learner.backend 'ray' needs ray: run scripts/install_openrlhf.sh") from exc
    from agentenv.trainer.learners.ray_group import RayLearnerGroup

    address = os.environ.get("RAY_ADDRESS")  # Ray's own setting: "auto" joins the cluster `ray start` set up
    if not ray.is_initialized():
        if address is None:  # a private Ray on this machine, loopback only
            ray.init(include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
        else:
            try:
                ray.init(address=address, log_to_driver=False)
            except ConnectionError as exc:
                raise ConfigError(
                    f"RAY_ADDRESS={address!r}: no Ray cluster answers ({exc}); start one with `ray start "
                    "--head` (`ray start --address <head>:6379` on the other nodes), or unset RAY_ADDRESS "
                    "for a private Ray on this machine"
                ) from exc
    lora = None
    if cfg.learner.lora_rank:  # every actor starts from this process's adapters (the engine's copy has them)
        from agentenv.trainer.learners.lora import adapter_state

        lora = (lora_settings(cfg), adapter_state(model))
    factory = functools.partial(actor_model, cfg.model.name, base_state, lora)
    # one GPU per rank when the Ray cluster has GPUs; without, the ranks run on CPUs with gloo
    gpus = 1.0 if ray.cluster_resources().get("GPU", 0) >= 1 else 0.0
    logger.info("starting %d Ray learner actors (%s GPU each)", cfg.learner.world_size, gpus)
    return RayLearnerGroup(
        factory, cfg.optim, backend_config(cfg), world_size=cfg.learner.world_size,
        num_gpus_per_actor=gpus,
        master_addr="127.0.0.1" if address is None else None,
        sampling=sampling_transform(cfg), total_steps=cfg.run.updates, objective=cfg.objective,
        execution=cfg.learner, loss_constant=loss_constant(cfg),
    )


def actor_model(
    name: str | None,
    state: dict[str, torch.Tensor] | None = None,
    lora: tuple[dict[str, Any], dict[str, torch.Tensor]] | None = None,
) -> torch.nn.Module:
    """Inside a Ray actor: the policy by name, with ``state`` loaded over it when given.

    Loaded in float32 on the CPU; DeepSpeed moves it to the actor's GPU and casts it to ``param_dtype``.
    ``lora``: :func:`agentenv.trainer.learners.lora.add_lora`'s settings and the adapter tensors to
    start from (the driver's, so that every rank and the engine hold the same ``A``).

    Raises:
        ValueError: ``lora``'s tensors are not exactly the adapters its settings add.
    """
    from agentenv.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(name, device="cpu")
    if state is not None:
        model.load_state_dict(state)
    if lora is not None:
        from agentenv.engines.weights import is_adapter_name
        from agentenv.trainer.learners.lora import add_lora

        settings, adapters = lora
        add_lora(model, **settings)
        missing, unexpected = model.load_state_dict(adapters, strict=False)
        left = [k for k in missing if is_adapter_name(k)]
        if left or unexpected:
            raise ValueError(f"the adapters sent to a learner actor do not match its model: missing {left[:3]}, "
                             f"unexpected {unexpected[:3]}")
    return model
