"""The distributed FlashREINFORCE learner on OpenRLHF's machinery (DeepSpeed strategy, Ray, vLLM sync).

The policy is wrapped by OpenRLHF 0.11.2's :class:`openrlhf.utils.deepspeed.DeepspeedStrategy`
(``strategy.prepare((model, cfg))`` builds the DeepSpeed engine, AdamW and the scheduler;
``strategy.backward`` / ``strategy.optimizer_step`` drive it). The loss is computed by OUR
:func:`agentenv.trainer.objectives.flash_reinforce_loss` (the one implementation shared with the
single-process learner), not by OpenRLHF's ``PolicyLoss``; ``tests/trainer/test_openrlhf_loss.py``
cross-checks the two on the same inputs.

Global denominators under DeepSpeed. The objective returns, for each micro-batch, its exact partial
sum of the full-batch loss (denominators ``B`` and ``T_i`` are the global ones). DeepSpeed divides
every backward loss by ``gradient_accumulation_steps`` (gas) and averages gradients over the ``dp``
data-parallel ranks, so each micro-batch loss is multiplied by ``gas * dp`` before
``strategy.backward``; the optimizer then sees exactly the full-batch gradient (the same idea as
OpenRLHF's ``aggregate_loss(..., dp_size)`` with ``global_batch_size / gas``). A rank whose share is
short of ``gas`` micro-batches runs zero-weight micro-steps so all ranks call DeepSpeed the same
number of times.

Every rank is called with the *whole* fresh batch (SPMD): advantages ``A_i = R_i - mean R`` are
taken over all B rows before the rows are sharded, and statistics are summed over ranks.

Paths:

* CPU (tested in CI): ``torch.distributed`` with gloo, a CPU device mesh, ZeRO stage 0 or 2, fp32,
  ``torch.optim.AdamW`` (DeepSpeed's FusedAdam needs CUDA). World size 1 in-process, or 2 processes
  on loopback (:func:`run_cpu_data_parallel`).
* GPU only, NOT TESTED HERE (no GPU in CI): ``strategy.setup_distributed()`` with NCCL and a CUDA
  mesh, bf16, FusedAdam; :class:`RayLearnerGroup` (one Ray actor per GPU, OpenRLHF's
  ``BaseDistributedActor`` for the rendezvous) and :class:`VLLMWeightSync` (OpenRLHF's NCCL weight
  broadcast from DeepSpeed rank 0 to its vLLM engines). They are marked ``GPU-only`` below.

Tensor legend: ``b`` rows here, ``B`` rows in the fresh batch, ``L`` padded tokens, ``t = L - 1``
label positions, ``V`` vocabulary size (see :mod:`agentenv.trainer.batching`).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from agentenv.errors import ConfigError, DataError
from agentenv.trainer.batching import PolicyBatch, shard, split_micro_batches
from agentenv.trainer.objectives import (
    FlashReinforceConfig,
    ObjectiveStats,
    batch_mean_advantages,
    flash_reinforce_loss,
)
from agentenv.trainer.openrlhf_compat import import_openrlhf

__all__ = [
    "OpenRLHFBackendConfig",
    "OpenRLHFLearner",
    "OpenRLHFUpdate",
    "RayLearnerGroup",
    "VLLMWeightSync",
    "make_strategy",
    "run_cpu_data_parallel",
    "token_logprobs",
]


@dataclass(frozen=True)
class OpenRLHFBackendConfig:
    """Configuration of the DeepSpeed/OpenRLHF learner (one fresh batch -> one optimizer step).

    Attributes:
        rows_per_update: B, trajectories per fresh batch (global, over all ranks). DeepSpeed's
            ``train_batch_size``; a batch may have fewer rows (excluded empty rows), never more.
        micro_batch_size: Rows per forward/backward on one rank. ``rows_per_update`` must be a
            multiple of ``micro_batch_size * world_size``; gas = B / (micro * world).
        zero_stage: DeepSpeed ZeRO stage 0-3 (CPU: 0-2 tested; 3 gathers weights for the engine).
        param_dtype: ``"fp32"`` (CPU), ``"bf16"`` (GPU) or ``"fp16"``.
        lr: AdamW learning rate (paper default 1e-6).
        weight_decay: AdamW decoupled weight decay (paper 0.1; OpenRLHF exempts biases and norms).
        betas: AdamW betas.
        eps: AdamW epsilon.
        max_grad_norm: Global gradient-norm clip (DeepSpeed ``gradient_clipping``); 0 disables.
        objective: FlashREINFORCE gate threshold and entropy filter.
        seed: Seed for ``transformers.set_seed`` in the strategy.
        torch_adam: Use ``torch.optim.AdamW`` instead of DeepSpeed's FusedAdam; None = only on CPU.

    Raises:
        ConfigError: a value out of range (checked in ``__post_init__``).
    """

    rows_per_update: int = 8
    micro_batch_size: int = 1
    zero_stage: int = 2
    param_dtype: str = "fp32"
    lr: float = 1e-6
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    max_grad_norm: float = 1.0
    objective: FlashReinforceConfig = field(default_factory=FlashReinforceConfig)
    seed: int = 0
    torch_adam: bool | None = None

    def __post_init__(self) -> None:
        if self.rows_per_update < 1 or self.micro_batch_size < 1:
            raise ConfigError("rows_per_update and micro_batch_size must be >= 1")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.param_dtype not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"param_dtype must be fp32, bf16 or fp16, got {self.param_dtype!r}")
        if not (self.lr > 0 and self.weight_decay >= 0 and self.max_grad_norm >= 0 and self.eps > 0):
            raise ConfigError("lr and eps must be > 0, weight_decay and max_grad_norm >= 0")

    def grad_accumulation_steps(self, world_size: int) -> int:
        """gas = B / (micro_batch_size * world_size).

        Raises:
            ConfigError: B is not a multiple of ``micro_batch_size * world_size``.
        """
        per_step = self.micro_batch_size * world_size
        if self.rows_per_update % per_step:
            raise ConfigError(
                f"rows_per_update={self.rows_per_update} is not a multiple of micro_batch_size * world_size "
                f"= {self.micro_batch_size} * {world_size}"
            )
        return self.rows_per_update // per_step


@dataclass(frozen=True)
class OpenRLHFUpdate:
    """What one :meth:`OpenRLHFLearner.update` did.

    Attributes:
        version: Policy version after the step (optimizer steps so far).
        stats: Objective statistics summed over micro-batches and ranks.
        grad_norm: Global gradient norm before clipping (DeepSpeed's figure).
        micro_steps: Micro-batches this rank ran (gas, padding micro-steps included).
    """

    version: int
    stats: ObjectiveStats
    grad_norm: float
    micro_steps: int


# ---------------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------------
def token_logprobs(
    model: nn.Module, batch: PolicyBatch, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the label tokens under ``model`` (label-aligned, see batching).

    Args:
        model: A causal LM (or DeepSpeed engine) returning ``.logits`` of shape ``(b, L, V)``.
        batch: Rows to score (tensors already on the model's device).
        with_entropy: Also return the per-position policy entropy (nats), detached.

    Returns:
        ``(logprobs, entropy)``: ``(b, t)`` float32 ``log pi(labels)``, and ``(b, t)`` or None.
    """
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    logits = out.logits[:, :-1, :].float()
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, batch.labels.unsqueeze(-1)).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


# ---------------------------------------------------------------------------------------------
# Strategy
# ---------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_rendezvous_env() -> None:
    """Single-process default rendezvous on loopback when no launcher set one (DeepSpeed would try MPI)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def make_strategy(config: OpenRLHFBackendConfig) -> Any:
    """Build and set up OpenRLHF's :class:`DeepspeedStrategy` for ``config`` on this machine.

    On CUDA it calls OpenRLHF's own ``setup_distributed`` (NCCL, CUDA mesh; GPU-only, untested here).
    On CPU it does the same steps with gloo and a CPU device mesh (OpenRLHF hard-codes ``"cuda"``),
    and asks DeepSpeed for ``torch.optim.AdamW`` (``torch_adam``) since FusedAdam needs CUDA.

    Returns:
        The strategy, with ``world_size``, ``ds_device_mesh`` and ``accumulated_gradient`` set.

    Raises:
        ConfigError: OpenRLHF missing, or B not divisible by ``micro_batch_size * world_size``.
    """
    orl = import_openrlhf()
    import deepspeed
    from torch.distributed.device_mesh import init_device_mesh

    cuda = torch.cuda.is_available()
    torch_adam = (not cuda) if config.torch_adam is None else config.torch_adam

    class _Strategy(orl.DeepspeedStrategy):  # adds torch_adam to OpenRLHF's DeepSpeed config
        def get_ds_train_config(self, optim_dict=None, *, max_norm=None):  # noqa: D102
            cfg = super().get_ds_train_config(optim_dict, max_norm=max_norm)
            if torch_adam and "optimizer" in cfg:
                cfg["optimizer"]["params"]["torch_adam"] = True
            return cfg

    _ensure_rendezvous_env()
    args = SimpleNamespace(
        local_rank=-1,
        ds=SimpleNamespace(param_dtype=config.param_dtype, zero_stage=config.zero_stage, adam_offload=False, zpg=1),
        train=SimpleNamespace(dynamic_batch_enable=False),
    )
    strategy = _Strategy(
        seed=config.seed,
        max_norm=config.max_grad_norm,
        micro_train_batch_size=config.micro_batch_size,
        train_batch_size=config.rows_per_update,
        zero_stage=config.zero_stage,
        args=args,
    )
    if cuda:  # GPU-only path (OpenRLHF's own setup: NCCL, torch.cuda.set_device, CUDA mesh).
        strategy.setup_distributed()
    else:
        import transformers

        transformers.set_seed(config.seed)
        # DeepSpeed's CPU accelerator JIT-compiles a C++ shared-memory all-reduce op (about 70 s on
        # 2 cores) when its comm backend starts; gloo does the same job here, so mark that op as
        # unavailable before the backend starts (DeepSpeed then uses plain torch.distributed).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        strategy.world_size = dist.get_world_size()
        strategy.ds_device_mesh = init_device_mesh("cpu", (strategy.world_size, 1, 1), mesh_dim_names=("dp", "sp", "tp"))
        strategy.ring_attn_rank = 0
        strategy.accumulated_gradient = config.rows_per_update // config.micro_batch_size // strategy.world_size
    config.grad_accumulation_steps(strategy.world_size)  # validates divisibility
    return strategy


# ---------------------------------------------------------------------------------------------
# Learner
# ---------------------------------------------------------------------------------------------
class OpenRLHFLearner:
    """FlashREINFORCE learner on a DeepSpeed engine built by OpenRLHF's strategy.

    Same interface as the single-process learner: :meth:`score`, :meth:`update`, :attr:`version`,
    :meth:`weights_for_engine`. Every rank of a data-parallel group must make the same calls with
    the same whole batch (SPMD).

    Args:
        model: The policy (a ``transformers`` causal LM); DeepSpeed takes ownership of it.
        config: Backend configuration.
        strategy: A strategy from :func:`make_strategy` (built from ``config`` when None).

    Raises:
        ConfigError: OpenRLHF/DeepSpeed missing or an inconsistent configuration.
    """

    def __init__(self, model: nn.Module, config: OpenRLHFBackendConfig, strategy: Any = None) -> None:
        self.config = config
        self.strategy = strategy if strategy is not None else make_strategy(config)
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.gas = config.grad_accumulation_steps(self.world_size)
        cfg = {
            "optim": "adam",
            "adam": {"lr": config.lr, "betas": config.betas, "eps": config.eps, "weight_decay": config.weight_decay},
            "lr_scheduler": "constant",
            "lr_warmup_ratio": 0.0,
            "max_norm": config.max_grad_norm,
            "scheduler_steps": 1,
        }
        self.engine, self.optimizer, self.scheduler = self.strategy.prepare((model, cfg))
        self.device = self.engine.device
        self._version = 0

    # -- interface ------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Policy version: optimizer steps taken so far."""
        return self._version

    def score(self, batch: PolicyBatch) -> torch.Tensor:
        """Current-policy log-probabilities of the batch's label tokens (no gradient).

        Each rank scores its shard; the rows are gathered back in batch order on every rank.

        Args:
            batch: The whole batch (same on every rank).

        Returns:
            ``(b, t)`` float32 CPU tensor, aligned with ``batch.loss_mask`` (0 at padding).
        """
        mine = shard(batch, self.rank, self.world_size)
        rows: list[torch.Tensor] = []
        if mine is not None:
            self.engine.eval()
            with torch.no_grad():
                for mb in split_micro_batches(mine, self.config.micro_batch_size):
                    lp, _ = token_logprobs(self.engine, mb.to(self.device))
                    rows.extend(lp.float().cpu())
            self.engine.train()
        parts = self._gather(rows)
        out = torch.zeros(batch.loss_mask.shape, dtype=torch.float32)
        for i, r in enumerate(r for p in parts for r in p):
            out[i, : r.shape[0]] = r
        return out

    def update(self, batch: PolicyBatch) -> OpenRLHFUpdate:
        """One FlashREINFORCE optimizer step on a fresh batch; then the version increments.

        Args:
            batch: The whole fresh batch (same on every rank), ``batch.num_rows <= rows_per_update``.

        Returns:
            :class:`OpenRLHFUpdate` with summed statistics and the pre-clip gradient norm.

        Raises:
            DataError: more rows than ``rows_per_update``, or invalid values (from the objective).
        """
        if batch.num_rows > self.config.rows_per_update:
            raise DataError(f"batch has {batch.num_rows} rows, more than rows_per_update={self.config.rows_per_update}")
        batch = replace(batch, advantages=batch_mean_advantages(batch.rewards).float())
        mine = shard(batch, self.rank, self.world_size)
        micro = [] if mine is None else split_micro_batches(mine, self.config.micro_batch_size)
        if len(micro) > self.gas:  # cannot happen with rows <= B, kept as a guard
            raise DataError(f"{len(micro)} micro-batches on rank {self.rank} exceed gas={self.gas}")
        scale = float(self.gas * self.world_size)  # undo DeepSpeed's 1/gas and 1/dp (see module doc)
        obj = self.config.objective
        stats = ObjectiveStats()
        for step in range(self.gas):
            if step < len(micro):
                mb = micro[step].to(self.device)
                lp, ent = token_logprobs(self.engine, mb, with_entropy=obj.entropy_keep_fraction is not None)
                out = flash_reinforce_loss(
                    lp, mb.behaviour_logprobs, mb.loss_mask, mb.advantages, mb.lengths, batch.global_batch_size,
                    delta=obj.delta, entropies=ent, entropy_keep_fraction=obj.entropy_keep_fraction, row_ids=mb.ids,
                )
                loss, stats = out.loss, stats + out.stats
            else:  # padding micro-step: zero gradient, keeps DeepSpeed's micro-step count in line
                mb = batch.select([0]).to(self.device)
                lp, _ = token_logprobs(self.engine, mb)
                loss = lp.sum() * 0.0
            self.strategy.backward(loss * scale, self.engine, self.optimizer)
            self.strategy.optimizer_step(self.optimizer, self.engine, self.scheduler)
        grad_norm = float(self.strategy.get_grad_norm(self.engine))
        self._version += 1
        total = ObjectiveStats(excluded_rows=batch.excluded_rows)
        for s in self._gather([stats]):
            total = total + s[0]
        return OpenRLHFUpdate(version=self._version, stats=total, grad_norm=grad_norm, micro_steps=self.gas)

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        """The full policy weights as CPU tensors keyed like the model's ``state_dict``.

        ZeRO 0-2 keep full parameters on every rank; ZeRO-3 gathers them (a collective: call it on
        every rank). Feed the dict to an engine's weight update (or use :class:`VLLMWeightSync`).
        """
        module = self.engine.module
        params = list(module.parameters())
        gather = self.config.zero_stage == 3
        import deepspeed

        with deepspeed.zero.GatheredParameters(params, enabled=gather):
            return {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}

    def full_gradients(self) -> dict[str, torch.Tensor]:
        """Full gradients held by DeepSpeed after the last backward of a step (for tests/debugging).

        Only meaningful between the last ``backward`` of an accumulation window and ``step``.
        """
        from deepspeed.utils import safe_get_full_grad

        return {
            n: safe_get_full_grad(p).detach().cpu().clone()
            for n, p in self.engine.module.named_parameters()
            if safe_get_full_grad(p) is not None
        }

    def close(self) -> None:
        """Release the engine (the process group stays for later learners in this process)."""
        self.engine = None  # type: ignore[assignment]

    # -- helpers -------------------------------------------------------------------------------
    def _gather(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts


# ---------------------------------------------------------------------------------------------
# CPU data parallelism on loopback (tested)
# ---------------------------------------------------------------------------------------------
def _dp_worker(rank: int, world_size: int, port: int, fn: Callable[[int], Any], results: Any) -> None:
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
    )
    try:
        results[rank] = ("ok", fn(rank))
    except BaseException as e:  # report, do not hang the parent
        import traceback

        results[rank] = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_cpu_data_parallel(fn: Callable[[int], Any], world_size: int = 2, timeout_s: float = 600.0) -> list[Any]:
    """Run ``fn(rank)`` in ``world_size`` spawned processes joined by gloo on 127.0.0.1.

    ``fn`` must be picklable (a module-level function or ``functools.partial``) and build its own
    :class:`OpenRLHFLearner`; its return value must be picklable.

    Returns:
        The per-rank return values, rank order.

    Raises:
        RuntimeError: a rank raised (its traceback is in the message) or did not finish in time.
    """
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        results = manager.dict()
        port = _free_port()
        procs = [ctx.Process(target=_dp_worker, args=(r, world_size, port, fn, results)) for r in range(world_size)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        alive = [p for p in procs if p.is_alive()]
        for p in alive:
            p.kill()
            p.join(5)
        if alive:
            raise RuntimeError(f"{len(alive)} of {world_size} ranks did not finish within {timeout_s:.0f} s")
        out = []
        for r in range(world_size):
            status, value = results.get(r, ("error", f"rank {r} exited with code {procs[r].exitcode}"))
            if status != "ok":
                raise RuntimeError(f"rank {r} failed: {value}")
            out.append(value)
        return out


# ---------------------------------------------------------------------------------------------
# GPU-only: Ray actors and vLLM weight broadcast (OpenRLHF's machinery). NOT TESTED in CI.
# ---------------------------------------------------------------------------------------------
class RayLearnerGroup:
    """GPU-only (untested here): ``world_size`` Ray actors, one per GPU, each an :class:`OpenRLHFLearner`.

    The actors use OpenRLHF's ``BaseDistributedActor`` for the rendezvous (MASTER_ADDR/PORT, RANK,
    WORLD_SIZE, LOCAL_RANK from Ray's GPU ids), as OpenRLHF's ``RayActorGroup`` does; rank 0's address
    is handed to the others. Calls fan out to every actor (SPMD) and return rank 0's result.

    Args:
        model_factory: Picklable zero-argument callable building the policy inside each actor.
        config: Backend configuration.
        world_size: Number of actors (GPUs).
        num_gpus_per_actor: GPUs per actor (1 on GPU machines).
    """

    def __init__(
        self,
        model_factory: Callable[[], nn.Module],
        config: OpenRLHFBackendConfig,
        world_size: int,
        num_gpus_per_actor: float = 1.0,
    ) -> None:
        import ray

        actor_cls = ray.remote(num_gpus=num_gpus_per_actor)(_learner_actor_class())
        first = actor_cls.remote(world_size, 0, None, None)
        addr, port = ray.get(first.get_master_addr_port.remote())
        self.actors = [first] + [actor_cls.remote(world_size, r, addr, port) for r in range(1, world_size)]
        ray.get([a.init_learner.remote(model_factory, config) for a in self.actors])

    def _all(self, method: str, *args: Any) -> Any:
        import ray

        return ray.get([getattr(a, method).remote(*args) for a in self.actors])[0]

    def update(self, batch: PolicyBatch) -> OpenRLHFUpdate:
        """One optimizer step on every actor; rank 0's :class:`OpenRLHFUpdate`."""
        return self._all("update", batch)

    def score(self, batch: PolicyBatch) -> torch.Tensor:
        """Current log-probabilities ``(b, t)`` (see :meth:`OpenRLHFLearner.score`)."""
        return self._all("score", batch)

    @property
    def version(self) -> int:
        """Policy version of rank 0."""
        return self._all("version")

    def weights_for_engine(self) -> dict[str, torch.Tensor]:
        """Full weights from rank 0 (ZeRO-3 gathers on all actors)."""
        return self._all("weights_for_engine")


def _learner_actor_class() -> type:
    orl_launcher = __import__("openrlhf.trainer.ray.launcher", fromlist=["BaseDistributedActor"])

    class _LearnerActor(orl_launcher.BaseDistributedActor):
        def init_learner(self, model_factory: Callable[[], nn.Module], config: OpenRLHFBackendConfig) -> None:
            self.learner = OpenRLHFLearner(model_factory(), config)

        def update(self, batch: PolicyBatch) -> OpenRLHFUpdate:
            return self.learner.update(batch)

        def score(self, batch: PolicyBatch) -> torch.Tensor:
            return self.learner.score(batch)

        def version(self) -> int:
            return self.learner.version

        def weights_for_engine(self) -> dict[str, torch.Tensor]:
            return self.learner.weights_for_engine()

    return _LearnerActor


class VLLMWeightSync:
    """GPU-only (untested here): OpenRLHF's NCCL weight broadcast from DeepSpeed rank 0 to vLLM engines.

    Mirrors ``ActorPPOTrainer._init_vllm_sync_group`` and ``broadcast_to_vllm`` of OpenRLHF 0.11.2:
    a stateless process group joins DeepSpeed rank 0 (rank 0 of the group) and every vLLM worker of
    the engines created by ``openrlhf.trainer.ray.create_vllm_engines``; each parameter (gathered under
    ZeRO-3) is announced to the engines (``update_weight.remote``) and broadcast from rank 0. Prefix
    caches are reset so no KV block computed by the old weights is reused.

    Args:
        learner: The rank's learner.
        vllm_engines: OpenRLHF ``RolloutRayActor`` handles.
        tensor_parallel_size: vLLM tensor-parallel size of each engine.
    """

    def __init__(self, learner: OpenRLHFLearner, vllm_engines: list[Any], tensor_parallel_size: int = 1) -> None:
        import ray

        from openrlhf.utils.distributed_util import stateless_init_process_group

        self.learner = learner
        self.engines = vllm_engines
        self.group = None
        if learner.rank == 0:
            addr = ray._private.services.get_node_ip_address()
            port = _free_port()
            world = len(vllm_engines) * tensor_parallel_size + 1
            refs = [
                e.init_process_group.remote(addr, port, i * tensor_parallel_size + 1, world, "agentenv", backend="nccl")
                for i, e in enumerate(vllm_engines)
            ]
            self.group = stateless_init_process_group(addr, port, 0, world, torch.cuda.current_device())
            ray.get(refs)
        dist.barrier()

    def broadcast(self) -> None:
        """Send every parameter to the engines (collective over the DeepSpeed ranks)."""
        import deepspeed
        import ray

        if self.learner.rank == 0:
            ray.get([e.reset_prefix_cache.remote() for e in self.engines])
        named = list(self.learner.engine.module.named_parameters())
        zero3 = self.learner.config.zero_stage == 3
        for count, (name, p) in enumerate(named, start=1):
            with deepspeed.zero.GatheredParameters([p], enabled=zero3):
                if self.learner.rank == 0:
                    shape = p.ds_shape if zero3 else p.shape
                    refs = [
                        e.update_weight.remote(name, dtype=p.dtype, shape=shape, empty_cache=count == len(named))
                        for e in self.engines
                    ]
                    self.group.broadcast(p.data, src=0, stream=torch.cuda.current_stream())
                    ray.get(refs)
        dist.barrier()
