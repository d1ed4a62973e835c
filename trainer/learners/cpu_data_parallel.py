"""``fn(rank)`` in spawned processes joined by gloo on loopback: the CPU test harness of the DeepSpeed learner.

Each rank builds its own :class:`agentenv.trainer.learners.openrlhf.OpenRLHFLearner` inside ``fn``, so no
process group or DeepSpeed state is left in the calling process (the tests' and ``agentenv train``'s
``learner.backend=openrlhf`` with ``learner.world_size > 1`` on a CPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from agentenv.trainer.learners.deepspeed_strategy import free_port

__all__ = ["run_cpu_data_parallel"]


def _dp_worker(rank: int, world_size: int, port: int, fn: Callable[[int], Any], results: Any) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    try:
        results[rank] = ("ok", fn(rank))
    except BaseException as e:  # report, do not hang the parent
        import traceback

        results[rank] = ("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_cpu_data_parallel(
    fn: Callable[[int], Any], world_size: int = 2, timeout_s: float = 600.0
) -> list[Any]:
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
        port = free_port()
        procs = [
            ctx.Process(target=_dp_worker, args=(r, world_size, port, fn, results)) for r in range(world_size)
        ]
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
