"""The float precision the objectives and the gate compute in: float32 at least, float64 kept."""

from __future__ import annotations

import torch

__all__ = ["as_work_float", "work_dtype"]


def work_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 for a float64 tensor, else float32 (bf16 and fp16 inputs are promoted)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def as_work_float(x: torch.Tensor) -> torch.Tensor:
    """``x`` in :func:`work_dtype` (integer and bool tensors become float32)."""
    return x.to(work_dtype(x)) if x.is_floating_point() else x.to(torch.float32)
