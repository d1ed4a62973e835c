"""The distributed FlashREINFORCE learner on OpenRLHF's machinery (DeepSpeed strategy, Ray, vLLM sync).

The policy is wrapped by OpenRLHF 0.11.2's :class:`openrlhf.utils.deepspeed.DeepspeedStrategy`
(``strategy.prepare((model, cfg))`` builds the DeepSpeed engine, AdamW and the scheduler;
``strategy.backward`` / ``strategy.optimizer_step`` drive it). Each micro-step's loss is
:func:`agentenv.trainer.learners.update_step.micro_batch_objective`, the one the single-process learner runs
(FlashREINFORCE or GRPO from :mod:`agentenv.trainer.objectives`), not OpenRLHF's ``PolicyLoss``;
``tests/trainer/test_openrlhf_loss.py`` cross-checks the two on the same inputs.

Global denominators under DeepSpeed. The objective returns, for each micro-batch, its exact partial
sum of the full-batch loss (denominators ``B`` and ``T_i`` are the global ones). Every backward goes
through ``engine.backward(loss, scale_wrt_gas=False)`` with the accumulation boundary set by the
learner (``engine.set_gradient_accumulation_boundary``), so DeepSpeed does not divide by its
configured gas and the micro-step count may vary per update (token-budget micro-batches); DeepSpeed
averages gradients over the ``dp`` data-parallel ranks, so each micro-batch loss is multiplied by
``dp``; the optimizer then sees exactly the full-batch gradient (the same idea as OpenRLHF's
``aggregate_loss(..., dp_size)``). ZeRO-2 reduces at every backward, so all ranks run the same
number of backward passes: a rank with fewer micro-batches runs zero-weight ones.

Every rank is called with the *whole* fresh batch (SPMD): advantages ``A_i = R_i - mean R`` are
taken over all B rows before the rows are sharded, and statistics are summed over ranks.

Paths:

* CPU (tested): ``torch.distributed`` with gloo, a CPU device mesh, ZeRO stage 0 or 2, fp32,
  ``torch.optim.AdamW`` (DeepSpeed's FusedAdam needs CUDA). World size 1 or 2 processes on loopback
  (:func:`agentenv.trainer.learners.cpu_data_parallel.run_cpu_data_parallel`), and
  :class:`agentenv.trainer.learners.ray_group.RayLearnerGroup` with two CPU Ray actors (OpenRLHF's
  ``BaseDistributedActor`` rendezvous; ``slow`` test).
* GPU only, NOT TESTED HERE (no GPU in CI): ``strategy.setup_distributed()`` with NCCL and a CUDA
  mesh, bf16, FusedAdam (``benchmarks/gpu_check.py`` runs one update through it on one GPU);
  :class:`RayLearnerGroup` with one GPU per actor. They are marked ``GPU-only``. Weights reach a
  vLLM engine through the engine's own ``update_weights`` (:mod:`agentenv.engines.vllm_engine`).

Checkpoints (``save`` / ``restore``, used by ``agentenv train`` through ``CheckpointManager``): the
full weights as ``model.safetensors`` plus DeepSpeed's own ``engine.save_checkpoint`` output (module,
ZeRO-partitioned optimizer, scheduler) under ``<checkpoint>/deepspeed``, published atomically with the
rest by :func:`agentenv.trainer.checkpoint.save_checkpoint`. Every Ray actor writes its own shard into
the same folder, so across nodes the run folder must be on a shared file system. Tested on a CPU:
one process (ZeRO-2) and two Ray actors, each resumed into fresh learners
(``tests/trainer/test_recipe_openrlhf.py``, ``test_recipe_ray.py``).

Tensor legend: ``b`` rows here, ``B`` rows in the fresh batch, ``L`` padded tokens, ``t = L - 1``
label positions, ``V`` vocabulary size (see :mod:`agentenv.trainer.batching`).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from agentenv.engines.sampling import SamplingTransform
from agentenv.engines.weights import is_adapter_name
from agentenv.errors import ConfigError, DataError
from agentenv.trainer.batching import (
    PolicyBatch,
    build_batch,
    micro_batch_rows,
    shard,
    shard_offset,
    split_micro_batches,
)
from agentenv.trainer.checkpoint import LoadedCheckpoint
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.deepspeed_strategy import OpenRLHFBackendConfig, make_strategy
from agentenv.trainer.learners.forward import (
    enable_gradient_checkpointing,
    mean_policy_entropy,
    shared_prefix,
    token_logprobs,
)
from agentenv.trainer.learners.lora import has_adapters
from agentenv.trainer.learners.update_step import (
    UpdateStats,
    check_objective_constant,
    micro_batch_objective,
    policy_log_ratios,
    prepare_batch,
    ratio_tail,
    skipped_stats,
    unscored_stats,
    update_stats,
)
from agentenv.trainer.lr_schedule import apply_optim_settings, build_scheduler, log_applied
from agentenv.trainer.objectives import ObjectiveStats
from agentenv.trajectory import Trajectory

if TYPE_CHECKING:
    from agentenv.trainer.learners.shared_prefix import SharedPrefix

__all__ = ["OpenRLHFLearner"]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------
class OpenRLHFLearner:
    """FlashREINFORCE/GRPO learner on a DeepSpeed engine built by OpenRLHF's strategy.

    The same interface and semantics as :class:`agentenv.trainer.learners.single.Learner`: :meth:`score`,
    :meth:`update` (one optimizer step per fresh batch, skipped without gradient signal unless
    ``step_on_zero_gradient``), :attr:`version`, :meth:`weights_for_engine`. Under data parallelism
    every rank makes the same calls with the same whole batch (SPMD).

    The skip decision is taken *before* the DeepSpeed micro-steps (DeepSpeed has no "skip this step"
    call): when ``scores`` are not given, :meth:`update` runs :meth:`score` first to get the gate's
    ``q`` (the same values the training forward would give: the weights have not moved).

    Args:
        model: The policy (a ``transformers`` causal LM); DeepSpeed takes ownership of it.
        optim: AdamW and its schedule; objective: the loss; execution: the ``learner`` section's
            micro-batching (the three as in :class:`agentenv.trainer.learners.single.Learner`; None: defaults).
        backend: DeepSpeed settings.
        pad_token_id: Pad id for batching.
        version: Starting policy version.
        strategy: A strategy from :func:`make_strategy` (built when None).
        sampling: The rollout's behaviour transform; log pi is scored under it (training and
            :meth:`score`), as in :class:`agentenv.trainer.learners.single.Learner`. None: the identity.
        total_steps: The run's optimizer steps, the horizon of a cosine lr schedule
            (:mod:`agentenv.trainer.lr_schedule`).
        loss_constant: ``K`` of ``loss_aggregation: constant``, as in :class:`agentenv.trainer.learners.single.Learner`.

    Raises:
        ConfigError: OpenRLHF/DeepSpeed missing or an inconsistent configuration.
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        backend: OpenRLHFBackendConfig | None = None,
        *,
        objective: ObjectiveConfig | None = None,
        execution: LearnerConfig | None = None,
        pad_token_id: int = 0,
        version: int = 0,
        strategy: Any = None,
        sampling: SamplingTransform | None = None,
        total_steps: int | None = None,
        loss_constant: float | None = None,
    ) -> None:
        self.optim = optim
        self.objective = objective if objective is not None else ObjectiveConfig()
        self.loss_constant = check_objective_constant(self.objective, loss_constant)
        self.execution = execution = execution if execution is not None else LearnerConfig()
        self.sampling = sampling if sampling is not None else SamplingTransform()
        self.backend = backend if backend is not None else OpenRLHFBackendConfig()
        self.pad_token_id = pad_token_id
        self.version = version
        self.strategy = strategy if strategy is not None else make_strategy(self.backend, optim, execution)
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.gas = self.backend.grad_accumulation_steps(execution.micro_batch_size, self.world_size)
        cfg = {
            "optim": "adam",
            "adam": {
                "lr": optim.lr,
                "betas": optim.betas,
                "eps": optim.adam_eps,
                "weight_decay": optim.weight_decay,
            },
            "lr_scheduler": "constant",
            "lr_warmup_ratio": 0.0,
            "max_norm": optim.grad_clip,
            "scheduler_steps": 1,
        }
        if execution.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        # LoRA (adapters added before, base frozen): OpenRLHF's optimizer takes the trainable tensors only
        self._adapters = has_adapters(model)
        self.engine, self.optimizer, _ = self.strategy.prepare((model, cfg))
        # The single-process learner's schedule, on the optimizer DeepSpeed steps; DeepSpeed calls
        # it once per optimizer step.
        base = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        self.scheduler = build_scheduler(base, optim, total_steps)
        self.engine.lr_scheduler = self.scheduler
        self.device = self.engine.device

    # -- scoring ----------------------------------------------------------------------------------
    def score(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current log pi(a_t) of each trajectory's policy tokens, without gradient.

        Each rank scores its contiguous share; the rows are gathered back on every rank.

        Returns:
            One ``(T_i,)`` float32 CPU tensor per trajectory, in order (``(0,)`` without policy token).

        Raises:
            DataError: as :func:`agentenv.trainer.batching.build_batch`, or a non-finite current
                log-probability at a policy token.
        """
        batch = build_batch(trajectories, self.pad_token_id)
        mine = shard(batch, self.rank, self.world_size)
        rows: dict[str, torch.Tensor] = {}
        if mine is not None:
            self.engine.eval()
            try:
                with torch.no_grad():
                    for mb in split_micro_batches(mine, self.execution.micro_batch_size):
                        lp, _ = self._logprobs(mb.to(self.device))
                        for i, tid in enumerate(mb.ids):
                            rows[tid] = lp[i][mb.loss_mask[i].to(lp.device)].float().cpu()
            finally:
                self.engine.train()
        for part in self._gather(rows):
            rows.update(part)
        for tid, r in rows.items():
            if not torch.isfinite(r).all():
                raise DataError(f"trajectory {tid}: non-finite current log-probability")
        return [rows.get(tr.id, torch.zeros(0)) for tr in trajectories]

    # -- the step ---------------------------------------------------------------------------------
    def entropy(self, trajectories: Sequence[Trajectory]) -> float:
        """The mean entropy of pi at the trajectories' policy tokens (nats/token), as :meth:`Learner.entropy`.

        Every rank scores all the rows (the same list on every rank); under ZeRO-3 through the engine's
        own forward, unchunked.
        """
        cfg, zero3 = self.execution, self.backend.zero_stage == 3
        return mean_policy_entropy(self.engine if zero3 else self.engine.module,
                                   build_batch(trajectories, self.pad_token_id),
                                   micro_batch_size=cfg.micro_batch_size, sampling=self.sampling,
                                   share_prefix=not zero3,
                                   chunk_tokens=None if zero3 else cfg.logprob_chunk_tokens, device=self.device)

    def prepare(
        self, trajectories: Sequence[Trajectory], scores: Sequence[torch.Tensor] | None
    ) -> tuple[PolicyBatch, torch.Tensor | None]:
        """Batch, global advantages and gate decision, as :meth:`Learner.prepare` (the same function)."""
        return prepare_batch(trajectories, scores, self.objective, self.pad_token_id)

    def update(
        self, trajectories: Sequence[Trajectory], *, scores: Sequence[torch.Tensor] | None = None
    ) -> UpdateStats:
        """One DeepSpeed optimizer step on a fresh batch, then ``version += 1`` (see the module doc).

        Args:
            trajectories: The fresh batch (at most ``rows_per_update`` rows; the same list on every rank).
            scores: Optional :meth:`score` output under the current weights (the gate's ``q``).

        Returns:
            :class:`UpdateStats` (``stepped`` False and the version unchanged when the batch carries
            no gradient and ``step_on_zero_gradient`` is False).

        Raises:
            DataError: more rows than ``rows_per_update``, empty batch, malformed trajectory, NaN/inf
                or positive log-probability at a policy token. The weights are untouched then.
        """
        t0 = time.perf_counter()
        batch, admitted = self.prepare(trajectories, scores)
        if self.objective.name == "flash_reinforce" and scores is None and bool((batch.advantages != 0).any()):
            scores = self.score(trajectories)  # the gate's q, for the skip decision before DeepSpeed steps
            batch, admitted = self.prepare(trajectories, scores)
        if batch.num_rows > self.backend.rows_per_update:
            raise DataError(
                f"batch has {batch.num_rows} rows, more than rows_per_update={self.backend.rows_per_update}"
            )
        signal = bool((batch.advantages != 0).any())
        if admitted is not None:
            signal = bool((admitted & (batch.advantages != 0)).any())
        stepped = signal or self.optim.step_on_zero_gradient
        stats, grad_norm = ObjectiveStats(), 0.0
        lr = float(self.scheduler.get_last_lr()[0])
        log_ratios: list[torch.Tensor] = []
        micro_steps = 0
        if stepped:
            stats, grad_norm, micro_steps = self._accumulate_and_step(batch, admitted, log_ratios)
            self.version += 1
        else:
            log.info("update skipped at version %d: no gradient signal", self.version)
        total = ObjectiveStats(excluded_rows=batch.excluded_rows)
        for part in self._gather(stats):
            total = total + part
        if not stepped:  # bookkeeping as the single-process learner reports it
            total = replace(total, rows=batch.num_rows, tokens=int(batch.lengths.sum()))
            if admitted is None:
                total = replace(unscored_stats(batch), excluded_rows=batch.excluded_rows)
        return update_stats(
            batch, total, version=self.version, stepped=stepped, grad_norm=grad_norm, lr=lr,
            seconds=time.perf_counter() - t0,
            extra={
                "perf/deepspeed_micro_steps": float(micro_steps),
                "perf/dp_world_size": float(self.world_size),
                **ratio_tail(log_ratios, self.objective.is_truncation),
            },
        )

    def _accumulate_and_step(
        self, batch: PolicyBatch, admitted: torch.Tensor | None, log_ratios: list[torch.Tensor]
    ) -> tuple[ObjectiveStats, float, int]:
        """This rank's micro-steps through DeepSpeed; the last is the accumulation boundary and steps.

        The pass is :meth:`agentenv.trainer.learners.single.Learner.backward`'s: under ZeRO 0-2 the prefix
        every row of the batch shares runs once (on every rank, the same input), this rank's rows
        go in micro-batches of :func:`micro_batch_rows` (``micro_batch_size`` rows and, when set,
        ``max_tokens_per_micro_batch`` padded tokens, sorted by length), a micro-batch without an
        admitted row of nonzero advantage skips its forward pass, and the prefix's gradient goes
        back through its pass once, as the last backward (:meth:`SharedPrefix.surrogate_loss`).
        DeepSpeed's fixed gas is not used: every backward sets the boundary explicitly and is not
        divided by gas, so the micro-step count may vary per update. ZeRO-2 reduces gradients at
        every backward, so all ranks take the same count (the largest); a rank with fewer, or with a
        skipped micro-batch, runs a zero-weight pass over one row in its place (the same parameters
        receive gradients in the same order on every rank).

        Args:
            batch: The whole fresh batch (advantages filled), the same on every rank.
            admitted: ``(B,)`` gate decision from precomputed scores, or None.
            log_ratios: Receives ``log pi - log mu`` at the policy tokens of each forward micro-batch.

        Returns:
            ``(stats, grad_norm, micro_steps)``: this rank's summed :class:`ObjectiveStats`, the
            global gradient norm before clipping, and the backward passes DeepSpeed ran.
        """
        cfg = self.execution
        mine = shard(batch, self.rank, self.world_size)
        offset = shard_offset(batch.num_rows, self.rank, self.world_size)
        self.engine.train()
        prefix = None
        if self.backend.zero_stage != 3:
            prefix = shared_prefix(self.engine.module, batch.to(self.device), leaves=True)
        n = prefix.length if prefix is not None else 0
        groups = [] if mine is None else micro_batch_rows(mine, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, n)
        passes = self._largest_over_ranks(len(groups))
        total = passes + (prefix is not None)
        stats, norm = ObjectiveStats(), 0.0
        for step in range(total):
            self.engine.set_gradient_accumulation_boundary(step == total - 1)
            if step < len(groups):
                mb = mine.select(groups[step])
                adm = admitted[offset + torch.as_tensor(groups[step])] if admitted is not None else None
                if adm is not None and not bool((adm & (mb.advantages != 0)).any()):
                    stats = stats + skipped_stats(mb, adm)
                    loss = self._zero_weight_loss(batch)
                else:
                    mb = mb.to(self.device)
                    lp, ent = self._logprobs(mb, with_entropy=True, prefix=prefix)
                    log_ratios.append(policy_log_ratios(lp, mb))
                    out = micro_batch_objective(lp, ent, mb, batch, self.objective, adm,
                                               loss_constant=self.loss_constant)
                    # DeepSpeed averages gradients over the dp ranks: undo it (module doc)
                    loss, stats = out.loss * self.world_size, stats + out.stats
            elif step < passes:  # padding: this rank has fewer micro-batches than another
                loss = self._zero_weight_loss(batch)
            else:  # the prefix's gradient, summed over every micro-batch, through its one pass
                loss = prefix.surrogate_loss()
            self.engine.backward(loss, scale_wrt_gas=False)
            if step == total - 1 and self.backend.zero_stage == 0:
                # Without ZeRO DeepSpeed does not record the norm; the reduced gradients sit in .grad.
                norm = _grad_norm(self.engine.module.parameters())
            self.engine.step()
        if self.backend.zero_stage != 0:
            norm = float(self.strategy.get_grad_norm(self.engine))
        return stats, norm, total

    def _zero_weight_loss(self, batch: PolicyBatch) -> torch.Tensor:
        """0 x the log-probabilities of one row: a backward that reduces zeros over every parameter."""
        lp, _ = self._logprobs(batch.select([0]).to(self.device))
        return lp.sum() * 0.0

    def _largest_over_ranks(self, count: int) -> int:
        """The largest ``count`` over the data-parallel ranks (every rank passes its own)."""
        if self.world_size == 1:
            return count
        value = torch.tensor([count], dtype=torch.long, device=self.device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return int(value.item())

    def _logprobs(
        self, mb: PolicyBatch, *, with_entropy: bool = False, prefix: SharedPrefix | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`agentenv.trainer.learners.forward.token_logprobs` of ``mb`` as the single-process learner scores it.

        Under ZeRO 0-2 every rank holds the full parameters, so the wrapped transformers model is
        called directly: the vocabulary projection runs in ``learner.logprob_chunk_tokens`` chunks and
        the rows attend to ``prefix``'s cache (or, without one, the prefix the micro-batch's rows
        share runs once); DeepSpeed's gradient hooks sit on the parameters,
        so ``engine.backward`` reduces the gradient as before. Under ZeRO-3 the engine's own forward
        gathers the partitioned parameters (unchunked, no shared prefix).
        """
        cfg = self.execution
        if self.backend.zero_stage == 3:
            return token_logprobs(self.engine, mb, with_entropy=with_entropy, sampling=self.sampling)
        return token_logprobs(self.engine.module, mb, with_entropy=with_entropy, sampling=self.sampling,
                              share_prefix=prefix is None,
                              chunk_tokens=cfg.logprob_chunk_tokens, prefix=prefix)

    # -- checkpoints ------------------------------------------------------------------------------
    def save(
        self, root: Path | str, *, pool_state: dict | None = None, extra: dict | None = None, keep: int = 2
    ) -> Path:
        """Checkpoint atomically: full weights (``model.safetensors``) plus DeepSpeed's own state.

        DeepSpeed's ``engine.save_checkpoint`` writes the module, the (ZeRO-partitioned) optimizer
        and the scheduler under ``<checkpoint>/deepspeed``; the folder is published like the
        single-process learner's (:func:`agentenv.trainer.checkpoint.save_checkpoint`). Single
        process only: ranks in other processes save through :class:`RayLearnerGroup`.

        Raises:
            CheckpointError: the write failed; the previous checkpoint stays the latest.
        """
        from agentenv.trainer.checkpoint import save_checkpoint

        if self.world_size > 1:
            raise ConfigError("OpenRLHFLearner.save runs in one process; save data-parallel ranks through "
                              "RayLearnerGroup.save (every rank writes its optimizer shard)")
        return save_checkpoint(
            root, model=self.checkpoint_weights(), optimizer=None, scheduler=None, version=self.version,
            pool_state=pool_state, extra=extra, keep=keep, write_state=self.save_state,
        )

    def restore(self, path: Path | str) -> LoadedCheckpoint:
        """Resume from a checkpoint folder or root written by :meth:`save` (version included).

        Raises:
            CheckpointError: missing or corrupt checkpoint, or one without DeepSpeed state (nothing
                is restored then).
        """
        from agentenv.trainer.checkpoint import load_checkpoint

        loaded = load_checkpoint(path, model=None, read_state=self.load_state)
        self.version = loaded.version
        return loaded

    def save_state(self, folder: Path | str) -> None:
        """DeepSpeed's ``save_checkpoint`` into ``folder/deepspeed`` (collective: every rank calls it)."""
        self.engine.save_checkpoint(str(Path(folder) / "deepspeed"), tag="state", save_latest=False)

    def load_state(self, folder: Path | str) -> None:
        """DeepSpeed's ``load_checkpoint`` from ``folder/deepspeed`` (collective: every rank calls it).

        Raises:
            CheckpointError: the folder holds no DeepSpeed state (a single-process learner's checkpoint).
        """
        from agentenv.errors import CheckpointError

        state = Path(folder) / "deepspeed"
        if not (state / "state").is_dir():
            raise CheckpointError(f"{folder} holds no DeepSpeed state (saved by another learner backend?)")
        loaded, _ = self.engine.load_checkpoint(
            str(state), tag="state", load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if loaded is None:
            raise CheckpointError(f"DeepSpeed could not load the state under {state}")
        base = getattr(self.engine, "basic_optimizer", None) or self.engine.optimizer
        changed = apply_optim_settings(base, self.scheduler, self.optim)
        if self.rank == 0:
            log_applied(changed)

    # -- weights ----------------------------------------------------------------------------------
    def weights_for_engine(self, path: Path | str | None = None) -> dict[str, torch.Tensor] | Path:
        """The policy weights, as :meth:`Learner.weights_for_engine` (dict, or a safetensors file).

        The full weights, or with LoRA adapters (``learner.lora_rank``) the adapter tensors only (the
        base never changes). ZeRO 0-2 keep full parameters on every rank; ZeRO-3 gathers them (a
        collective: call it on every rank). A file is written by rank 0 only (atomically), and its
        path returned on all ranks.
        """
        sd = self._state(adapters_only=self._adapters)
        if path is None:
            return sd
        from safetensors.torch import save_file

        path = Path(path)
        if self.rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.tmp")
            save_file(sd, str(tmp), metadata={"version": str(self.version)})
            tmp.replace(path)
        if self.world_size > 1:
            dist.barrier()
        return path

    def checkpoint_weights(self) -> dict[str, torch.Tensor]:
        """Every tensor of the policy, adapters and frozen base included: what a checkpoint holds.

        ZeRO-3 gathers them (a collective: call it on every rank).
        """
        return self._state(adapters_only=False)

    # -- helpers -------------------------------------------------------------------------------
    def _state(self, *, adapters_only: bool) -> dict[str, torch.Tensor]:
        """Detached CPU copies of the module's state dict, or of its LoRA adapter tensors alone."""
        import deepspeed

        module = self.engine.module
        params = [p for n, p in module.named_parameters() if not adapters_only or is_adapter_name(n)]
        with deepspeed.zero.GatheredParameters(params, enabled=self.backend.zero_stage == 3):
            return {k: v.detach().to("cpu", copy=True).contiguous() for k, v in module.state_dict().items()
                    if not adapters_only or is_adapter_name(k)}

    def _gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts


def _grad_norm(params: Any) -> float:
    """Global L2 norm of the ``.grad`` of ``params`` (float64 accumulation)."""
    sq = sum(float(p.grad.double().pow(2).sum()) for p in params if p.grad is not None)
    return math.sqrt(sq)
