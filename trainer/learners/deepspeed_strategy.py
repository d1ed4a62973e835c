"""OpenRLHF's DeepSpeed strategy for the distributed learner: its settings and its setup on a GPU or a CPU.

:class:`OpenRLHFBackendConfig` holds the DeepSpeed settings (ZeRO stage, dtype, accumulation);
:func:`make_strategy` builds OpenRLHF 0.11.2's :class:`openrlhf.utils.deepspeed.DeepspeedStrategy`
from them, with NCCL on CUDA and gloo on a CPU. The learner that drives it is
:class:`agentenv.trainer.learners.openrlhf.OpenRLHFLearner`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist

from agentenv.errors import ConfigError
from agentenv.trainer.learners.config import LearnerConfig, OptimConfig
from agentenv.trainer.learners.openrlhf_compat import import_openrlhf

__all__ = ["OpenRLHFBackendConfig", "free_port", "make_strategy"]


@dataclass(frozen=True)
class OpenRLHFBackendConfig:
    """DeepSpeed/OpenRLHF settings of the distributed learner (optimizer settings: ``OptimConfig``).

    Attributes:
        rows_per_update: B, trajectories per fresh batch over all ranks (DeepSpeed's
            ``train_batch_size``). A batch may have fewer rows (trajectories without policy tokens are
            excluded), never more. Must be a multiple of ``micro_batch_size * world_size``; the
            gradient-accumulation steps are gas = B / (micro_batch_size * world_size).
        zero_stage: DeepSpeed ZeRO stage 0-3 (CPU: 0 and 2 tested; 3 gathers weights for the engine).
        param_dtype: ``"fp32"`` (CPU), ``"bf16"`` (GPU) or ``"fp16"``.
        seed: Seed for ``transformers.set_seed`` in the strategy.
        torch_adam: Use ``torch.optim.AdamW`` instead of DeepSpeed's FusedAdam; None = only on CPU.

    Raises:
        ConfigError: a value out of range.
    """

    rows_per_update: int = 8
    zero_stage: int = 2
    param_dtype: str = "fp32"
    seed: int = 0
    torch_adam: bool | None = None

    def __post_init__(self) -> None:
        if self.rows_per_update < 1:
            raise ConfigError(f"rows_per_update must be >= 1, got {self.rows_per_update}")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.param_dtype not in ("fp32", "bf16", "fp16"):
            raise ConfigError(f"param_dtype must be fp32, bf16 or fp16, got {self.param_dtype!r}")

    def grad_accumulation_steps(self, micro_batch_size: int, world_size: int) -> int:
        """Gradient-accumulation steps per update: B / (micro_batch_size * world_size).

        Raises:
            ConfigError: B is not a multiple of ``micro_batch_size * world_size``.
        """
        per_step = micro_batch_size * world_size
        if self.rows_per_update % per_step:
            raise ConfigError(
                f"rows_per_update={self.rows_per_update} is not a multiple of micro_batch_size * world_size "
                f"= {micro_batch_size} * {world_size}"
            )
        return self.rows_per_update // per_step


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a loopback rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_rendezvous_env() -> None:
    """Single-process default rendezvous on loopback when no launcher set one (DeepSpeed would try MPI)."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def make_strategy(backend: OpenRLHFBackendConfig, optim: OptimConfig, execution: LearnerConfig) -> Any:
    """Build and set up OpenRLHF's :class:`DeepspeedStrategy` on this machine.

    On CUDA it calls OpenRLHF's own ``setup_distributed`` (NCCL, CUDA mesh; GPU-only, untested here).
    On CPU it does the same steps with gloo and a CPU device mesh (OpenRLHF hard-codes ``"cuda"``),
    and asks DeepSpeed for ``torch.optim.AdamW`` (``torch_adam``) since FusedAdam needs CUDA.

    Args:
        backend: DeepSpeed settings.
        optim: Optimizer settings (``grad_clip`` is used here).
        execution: The ``learner`` section (``micro_batch_size`` is used here).

    Returns:
        The strategy, with ``world_size``, ``ds_device_mesh`` and ``accumulated_gradient`` set.

    Raises:
        ConfigError: OpenRLHF missing, or B not divisible by ``micro_batch_size * world_size``.
    """
    orl = import_openrlhf()
    import deepspeed
    from torch.distributed.device_mesh import init_device_mesh

    cuda = torch.cuda.is_available()
    torch_adam = (not cuda) if backend.torch_adam is None else backend.torch_adam

    class _Strategy(orl.DeepspeedStrategy):  # adds torch_adam to OpenRLHF's DeepSpeed config
        def get_ds_train_config(self, optim_dict=None, *, max_norm=None):  # noqa: D102
            cfg = super().get_ds_train_config(optim_dict, max_norm=max_norm)
            if torch_adam and "optimizer" in cfg:
                cfg["optimizer"]["params"]["torch_adam"] = True
            return cfg

    _ensure_rendezvous_env()
    args = SimpleNamespace(
        local_rank=-1,
        ds=SimpleNamespace(
            param_dtype=backend.param_dtype, zero_stage=backend.zero_stage, adam_offload=False, zpg=1
        ),
        train=SimpleNamespace(dynamic_batch_enable=False),
    )
    strategy = _Strategy(
        seed=backend.seed,
        max_norm=optim.grad_clip,
        micro_train_batch_size=execution.micro_batch_size,
        train_batch_size=backend.rows_per_update,
        zero_stage=backend.zero_stage,
        args=args,
    )
    if cuda:  # GPU-only path (OpenRLHF's own setup: NCCL, torch.cuda.set_device, CUDA mesh).
        strategy.setup_distributed()
    else:
        import transformers

        transformers.set_seed(backend.seed)
        # DeepSpeed's CPU accelerator JIT-compiles a C++ shared-memory all-reduce op (about 70 s on
        # 2 cores) when its comm backend starts; gloo does the same job here, so mark that op as
        # unavailable before the backend starts (DeepSpeed then uses plain torch.distributed).
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
        strategy.world_size = dist.get_world_size()
        strategy.ds_device_mesh = init_device_mesh(
            "cpu", (strategy.world_size, 1, 1), mesh_dim_names=("dp", "sp", "tp")
        )
        strategy.ring_attn_rank = 0
        strategy.accumulated_gradient = (
            backend.rows_per_update // execution.micro_batch_size // strategy.world_size
        )
    backend.grad_accumulation_steps(execution.micro_batch_size, strategy.world_size)  # validates divisibility
    return strategy
