"""A single-process learner (CPU or one GPU, optionally data-parallel over torch.distributed).

``Learner(model, optim, objective=..., execution=...)`` owns the model, the AdamW optimizer and its
learning-rate schedule (:mod:`agentenv.trainer.learners.config` holds the three settings); it scores
trajectories for PACE's drift and the gate, and applies exactly one optimizer step per fresh batch
with :mod:`agentenv.trainer.objectives` (FlashREINFORCE or GRPO), accumulating gradients over
micro-batches with the *global* denominators B and T_i (or N for GRPO). Under torch.distributed
every rank receives the whole batch, works on its contiguous share of the rows, and the partial
gradients are all-reduced with SUM (the denominators are global, so no averaging).

Policy version = number of optimizer steps taken. A batch that carries no gradient at all (every
row rejected by the gate, or every admitted row with advantage exactly 0) is discarded *without* an
optimizer step by default (``optim.step_on_zero_gradient = False``): AdamW would otherwise
still move the weights (decoupled weight decay and the momentum of earlier batches) with no learning
signal, and bump the version, which would count as staleness for every trajectory in flight. The
skip is reported in :class:`UpdateStats` (``stepped = False``) and logged.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from agentenv.engines.sampling import SamplingTransform
from agentenv.engines.shared_weights import SharedWeights
from agentenv.errors import DataError
from agentenv.malloc import release_free_heap
from agentenv.trainer.batching import (
    PolicyBatch,
    build_batch,
    micro_batch_rows,
    shard,
    shard_offset,
    split_micro_batches,
)
from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.forward import (
    enable_gradient_checkpointing,
    mean_policy_entropy,
    shared_prefix,
    token_logprobs,
)
from agentenv.trainer.learners.lora import adapter_state, has_adapters
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
    from agentenv.trainer.checkpoint import LoadedCheckpoint

__all__ = ["Learner"]

log = logging.getLogger(__name__)


class Learner:
    """Single-process FlashREINFORCE/GRPO learner for a transformers causal LM.

    Args:
        model: A causal LM (``transformers`` ``PreTrainedModel`` or anything returning ``.logits``).
        optim: AdamW and its schedule (:class:`~agentenv.trainer.learners.config.OptimConfig`).
        objective: The loss (:class:`~agentenv.trainer.learners.config.ObjectiveConfig`; None: its defaults).
        execution: How the update's rows are cut into passes: micro-batch rows and tokens, the
            log-probability chunk, activation checkpointing, the shared prefix (the ``learner``
            section, :class:`~agentenv.trainer.learners.config.LearnerConfig`; its backend fields are
            not read here; None: its defaults).
        pad_token_id: Pad id for batching (the tokenizer's pad id; never scored).
        version: Starting policy version (a resumed run passes the checkpoint's).
        sampling: The rollout's behaviour transform (temperature, top-p, top-k): log pi is scored under
            it for training and for :meth:`score` alike. None: the identity (temperature 1, no
            truncation), right only when the rollouts sample that way.
        total_steps: The run's optimizer steps (``run.updates``), the horizon of a cosine schedule;
            None is allowed for ``lr_schedule: constant`` only.
        loss_constant: ``K`` of ``objective.loss_aggregation: constant`` (policy tokens, > 0; the
            trainer passes the rollout's policy-token budget,
            :func:`~agentenv.trainer.learners.backends.loss_constant`);
            None with any other aggregation.

    Attributes:
        version: Policy version = optimizer steps taken (including those before a resume).
        optimizer: ``torch.optim.AdamW``; scheduler: ``LambdaLR`` of ``optim.lr_schedule``
            (:func:`agentenv.trainer.lr_schedule.build_scheduler`).

    Raises:
        ConfigError: A cosine schedule without ``total_steps > optim.warmup_steps``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optim: OptimConfig,
        *,
        objective: ObjectiveConfig | None = None,
        execution: LearnerConfig | None = None,
        pad_token_id: int = 0,
        version: int = 0,
        sampling: SamplingTransform | None = None,
        total_steps: int | None = None,
        loss_constant: float | None = None,
    ) -> None:
        self.model = model
        self.optim = optim
        self.objective = objective if objective is not None else ObjectiveConfig()
        self.loss_constant = check_objective_constant(self.objective, loss_constant)
        self.execution = execution = execution if execution is not None else LearnerConfig()
        self.sampling = sampling if sampling is not None else SamplingTransform()
        self.pad_token_id = pad_token_id
        self.version = version
        if execution.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=optim.lr, betas=optim.betas, eps=optim.adam_eps, weight_decay=optim.weight_decay
        )
        self.scheduler = build_scheduler(self.optimizer, optim, total_steps)
        self._params = params
        self._adapters = has_adapters(model)  # LoRA: only the adapters train and go to the engine
        self._shared: SharedWeights | None = None

    # -- scoring ----------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        """Device of the model's parameters."""
        return next(self.model.parameters()).device

    @torch.no_grad()
    def score(self, trajectories: Sequence[Trajectory]) -> list[torch.Tensor]:
        """Current log pi(a_t) of each trajectory's policy tokens (nats, under ``sampling``), without gradient.

        Used by PACE's prefix drift and as the gate's ``q`` (pass the result to :meth:`update`).
        The result is valid while ``version`` is unchanged; callers may cache it per version.

        Returns:
            One ``(T_i,)`` float32 CPU tensor per trajectory, in order (``(0,)`` for a trajectory with
            no policy token).

        Raises:
            DataError: as :func:`agentenv.trainer.batching.build_batch`, or a non-finite current
                log-probability at a policy token (names the trajectory).
        """
        was_training = self.model.training
        self.model.eval()
        try:
            out: list[torch.Tensor] = [torch.zeros(0) for _ in trajectories]
            batch = build_batch(trajectories, self.pad_token_id)
            ex = self.execution
            for mb in split_micro_batches(batch, ex.micro_batch_size):
                mb = mb.to(self.device)
                lp, _ = token_logprobs(self.model, mb, sampling=self.sampling, share_prefix=True,
                                       chunk_tokens=ex.logprob_chunk_tokens)
                for i, (tid, k) in enumerate(zip(mb.ids, mb.source_index, strict=True)):
                    row = lp[i][mb.loss_mask[i]].float().cpu()
                    if not torch.isfinite(row).all():
                        raise DataError(f"trajectory {tid}: non-finite current log-probability")
                    out[k] = row
        finally:
            self.model.train(was_training)
        return out

    # -- gradients --------------------------------------------------------------------------------

    def entropy(self, trajectories: Sequence[Trajectory]) -> float:
        """The mean entropy of pi (under ``sampling``) at the trajectories' policy tokens (nats/token), no gradient.

        The exact entropy of the whole next-token distribution at each position, not the surprise
        of the sampled token; on a fixed set of trajectories scored after every update it follows
        how sure the policy is in the same states (``run.entropy_probe``).

        Raises:
            DataError: As :func:`agentenv.trainer.batching.build_batch`, or no policy token at all.
        """
        cfg = self.execution
        return mean_policy_entropy(self.model, build_batch(trajectories, self.pad_token_id),
                                   micro_batch_size=cfg.micro_batch_size, sampling=self.sampling,
                                   share_prefix=True, chunk_tokens=cfg.logprob_chunk_tokens,
                                   device=self.device)

    def prepare(
        self, trajectories: Sequence[Trajectory], scores: Sequence[torch.Tensor] | None = None
    ) -> tuple[PolicyBatch, torch.Tensor | None]:
        """Build the padded batch, its global advantages and (with ``scores``) the gate decision.

        Returns:
            ``(batch, admitted)``: ``admitted`` is ``(B,)`` bool from the scores, or None.

        Raises:
            DataError: empty batch, malformed trajectory, scores not matching the trajectories.
            ConfigError: GRPO with a batch that is not whole groups.
        """
        return prepare_batch(trajectories, scores, self.objective, self.pad_token_id)

    def backward(
        self, batch: PolicyBatch, admitted: torch.Tensor | None = None,
        log_ratios: list[torch.Tensor] | None = None,
    ) -> ObjectiveStats:
        """Accumulate this rank's share of the full-batch gradient into ``.grad`` (no step, no reduce).

        Rows are processed in micro-batches of at most ``execution.micro_batch_size`` rows and, when
        set, ``execution.max_tokens_per_micro_batch`` padded tokens (:func:`micro_batch_rows`); the
        prefix every row shares runs once before them
        (:mod:`agentenv.trainer.learners.shared_prefix`) and its gradient is
        back-propagated once after them. The objective uses the global B, T_i and N, so the
        accumulated gradient does not depend on the split. glibc's free heap is returned to the
        operating system before the first micro-batch (:func:`agentenv.malloc.release_free_heap`).

        Args:
            batch: From :meth:`prepare` (advantages filled).
            admitted: ``(B,)`` precomputed gate decision, or None to gate on the training forward.
            log_ratios: When given, receives each forward micro-batch's ``log pi - log mu`` at its
                policy tokens (a 1-d float32 CPU tensor each; skipped micro-batches add none).

        Returns:
            This rank's summed :class:`ObjectiveStats`.
        """
        cfg = self.execution
        rank, world = _rank_world()
        mine = shard(batch, rank, world) if world > 1 else batch
        stats = ObjectiveStats()
        if mine is None:
            return stats
        offset = shard_offset(batch.num_rows, rank, world)
        adm_mine = admitted[offset : offset + mine.num_rows] if admitted is not None else None
        release_free_heap()  # freed blocks of the last step leave the process before this one's activations
        prefix = shared_prefix(self.model, mine, leaves=True)
        n = prefix.length if prefix is not None else 0
        for rows in micro_batch_rows(mine, cfg.micro_batch_size, cfg.max_tokens_per_micro_batch, n):
            mb = mine.select(rows)
            adm = adm_mine[torch.as_tensor(rows)] if adm_mine is not None else None
            if adm is not None and not bool((adm & (mb.advantages != 0)).any()):
                # No row here carries gradient: skip the forward, keep the bookkeeping.
                stats = stats + skipped_stats(mb, adm)
                continue
            mb = mb.to(self.device)
            lp, ent = token_logprobs(self.model, mb, with_entropy=True, sampling=self.sampling,
                                     chunk_tokens=cfg.logprob_chunk_tokens, prefix=prefix)
            if log_ratios is not None:
                log_ratios.append(policy_log_ratios(lp, mb))
            out = micro_batch_objective(lp, ent, mb, batch, self.objective, adm, loss_constant=self.loss_constant)
            if out.loss.requires_grad:
                out.loss.backward()
            stats = stats + out.stats
            del lp, ent, out
        if prefix is not None:
            prefix.backward()  # the prefix's gradient, summed over every micro-batch, through its one pass
        return stats

    # -- the step ---------------------------------------------------------------------------------
    def update(
        self, trajectories: Sequence[Trajectory], *, scores: Sequence[torch.Tensor] | None = None
    ) -> UpdateStats:
        """One optimizer step on a fresh batch (then the batch is discarded), and ``version += 1``.

        Args:
            trajectories: The fresh batch (B rows; each rank passes the same list under
                torch.distributed).
            scores: Optional output of :meth:`score` for these trajectories under the current
                weights (one ``(T_i,)`` tensor per trajectory, in order); when given, the
                FlashREINFORCE gate uses it as ``q`` (the same q PACE's drift used) and micro-batches
                with no admitted row of nonzero advantage skip their forward pass. GRPO ignores it.
                A batch in which every advantage is 0 runs no forward pass at all (no gradient can
                come from it whatever the policy); its gate statistics are then not measured
                (``gate/mean_d`` is NaN).

        Returns:
            :class:`UpdateStats`. ``stepped`` is False (and the version unchanged) when the batch
            carried no gradient and ``optim.step_on_zero_gradient`` is False.

        Raises:
            DataError: empty batch, malformed trajectory, NaN/inf or positive log-probability at a
                policy token (the message names the trajectory id). The model and optimizer are
                untouched when this is raised (gradients are cleared).
        """
        t0 = time.perf_counter()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        log_ratios: list[torch.Tensor] = []
        try:
            batch, admitted = self.prepare(trajectories, scores)
            if bool((batch.advantages != 0).any()):
                stats = self.backward(batch, admitted, log_ratios)
            else:  # every advantage 0: no gradient whatever the policy, so no forward pass
                stats = unscored_stats(batch) if _rank_world()[0] == 0 else ObjectiveStats()
        except Exception:
            self.optimizer.zero_grad(set_to_none=True)
            raise
        stats = _all_reduce_stats(stats)
        stats = _with_excluded(stats, batch.excluded_rows)
        has_signal = stats.kept_tokens > 0 and any(
            p.grad is not None and bool(p.grad.any()) for p in self._params
        )
        has_signal = _all_reduce_flag(has_signal)
        _all_reduce_grads(self._params)
        lr = float(self.optimizer.param_groups[0]["lr"])
        grad_norm = 0.0
        stepped = has_signal or self.optim.step_on_zero_gradient
        if stepped:
            norm = torch.nn.utils.clip_grad_norm_(
                self._params, self.optim.grad_clip if self.optim.grad_clip > 0 else math.inf
            )
            grad_norm = float(norm)
            if not math.isfinite(grad_norm):
                self.optimizer.zero_grad(set_to_none=True)
                raise DataError(f"non-finite gradient norm {grad_norm}; batch {list(batch.ids)[:4]} skipped")
            with self._writing():  # an engine decoding these parameters in place waits for the step
                self.optimizer.step()
                self.scheduler.step()
                self.version += 1
        else:
            log.info(
                "update skipped at version %d: no gradient (admitted %d/%d rows, advantage std %.3g)",
                self.version, stats.admitted, stats.rows, stats.advantage_std,
            )
        self.optimizer.zero_grad(set_to_none=True)
        return update_stats(batch, stats, version=self.version, stepped=stepped, grad_norm=grad_norm, lr=lr,
                            seconds=time.perf_counter() - t0,
                            extra=ratio_tail(log_ratios, self.objective.is_truncation))

    # -- checkpoints ------------------------------------------------------------------------------
    def save(
        self, root: Path | str, *, pool_state: dict | None = None, extra: dict | None = None, keep: int = 2
    ) -> Path:
        """Checkpoint model, optimizer, scheduler, version, pool state and RNG states atomically.

        See :func:`agentenv.trainer.checkpoint.save_checkpoint` (raises ``CheckpointError``).
        """
        from agentenv.trainer.checkpoint import save_checkpoint

        return save_checkpoint(
            root, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler, version=self.version,
            pool_state=pool_state, extra=extra, keep=keep,
        )

    def restore(self, path: Path | str) -> LoadedCheckpoint:
        """Resume from a checkpoint folder or root; the version numbering continues from it.

        The optimizer's moments and the schedule's step count come from the checkpoint; the lr,
        betas, eps and weight decay are this learner's ``optim`` (a change is logged as a warning).
        See :func:`agentenv.trainer.checkpoint.load_checkpoint` (raises ``CheckpointError`` and then
        leaves the learner unchanged).
        """
        from agentenv.trainer.checkpoint import load_checkpoint

        with self._writing():
            loaded = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
            self.version = loaded.version
        log_applied(apply_optim_settings(self.optimizer, self.scheduler, self.optim))
        return loaded

    # -- weights ----------------------------------------------------------------------------------
    def share_weights(self) -> SharedWeights:
        """The lock under which an engine in this process may decode with this learner's own parameters.

        From the first call on, the optimizer step and :meth:`restore` write the parameters inside
        its ``writing()`` and advance :attr:`version` there; its ``version`` is this learner's. Serve
        them with ``TransformersEngine.serve_in_place(learner.model, lock)``; :meth:`weights_for_engine`
        is then not needed.
        """
        if self._shared is None:
            self._shared = SharedWeights(lambda: self.version)
        return self._shared

    def _writing(self) -> AbstractContextManager[None]:
        return self._shared.writing() if self._shared is not None else nullcontext()

    def weights_for_engine(self, path: Path | str | None = None) -> dict[str, torch.Tensor] | Path:
        """The current weights for ``engine.update_weights(weights, learner.version)``.

        Args:
            path: None returns a detached CPU copy of the state dict (safe to hand to another thread
                while training continues); a path writes a safetensors file there (atomically: a
                temporary file in the same folder, then rename) and returns the path (vLLM loads
                files, not tensors).

        Tied tensors (``lm_head.weight`` sharing ``model.embed_tokens.weight``) are copied once: in
        the state dict every name of a tied group maps to that one copy; the file holds the first
        name only (what :func:`agentenv.engines.weights.check_state_dict` needs).

        A model with LoRA adapters (``learner.lora_rank``) gives its adapter tensors only: the base
        weights never change, and the engine's copy of the model has the same adapters
        (:func:`agentenv.engines.weights.check_state_dict`).

        Returns:
            The state dict or the file path.
        """
        sd = adapter_state(self.model) if self._adapters else _cpu_state_dict(self.model)
        if path is None:
            return sd
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        firsts: dict[int, str] = {}  # one name per tied group: safetensors refuses shared tensors
        for k, v in sd.items():
            firsts.setdefault(id(v), k)
        save_file({k: sd[k] for k in firsts.values()}, str(tmp), metadata={"version": str(self.version)})
        tmp.replace(path)
        return path


def _cpu_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of ``model``'s state dict, each tied group copied once (its names share the copy)."""
    sd: dict[str, torch.Tensor] = {}
    copies: dict[tuple, str] = {}  # (address, shape, strides) of a model tensor -> its first name
    for k, v in model.state_dict().items():
        where = (v.device, v.data_ptr(), tuple(v.shape), v.stride())
        first = copies.setdefault(where, k)
        sd[k] = sd[first] if first != k else v.detach().to("cpu", copy=True).contiguous()
    return sd


# -- shared by the learners (this one and agentenv.trainer.learners.openrlhf) ---------------------------
def _rank_world() -> tuple[int, int]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_reduce_grads(params: Sequence[torch.Tensor]) -> None:
    """SUM the partial gradients over ranks (denominators are global, so no averaging)."""
    _, world = _rank_world()
    if world == 1:
        return
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        torch.distributed.all_reduce(p.grad, op=torch.distributed.ReduceOp.SUM)


def _all_reduce_flag(flag: bool) -> bool:
    _, world = _rank_world()
    if world == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)


_SUM_FIELDS = (
    "rows", "admitted", "admitted_tokens", "tokens", "kept_tokens", "d_sum", "rho_sum", "adv_sum", "adv_sq_sum",
    "loss_sum", "surrogate_sum", "clipped_tokens", "behaviour_nll_sum", "entropy_sum", "entropy_tokens",
)


def _all_reduce_stats(stats: ObjectiveStats) -> ObjectiveStats:
    _, world = _rank_world()
    if world == 1:
        return stats
    t = torch.tensor([float(getattr(stats, f)) for f in _SUM_FIELDS], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM)
    vals = {
        f: (int(round(v)) if isinstance(getattr(stats, f), int) else v)
        for f, v in zip(_SUM_FIELDS, t.tolist(), strict=True)
    }
    return ObjectiveStats(**vals)


def _with_excluded(stats: ObjectiveStats, excluded: int) -> ObjectiveStats:
    return replace(stats, excluded_rows=excluded)
