"""The one place an engine is built: ``agentenv train`` (an in-memory policy) and ``agentenv eval`` (a model folder).

:func:`build_engine` chooses the engine's class and its precision: vLLM serves bfloat16 weights on a
GPU and the checkpoint's own dtype on a CPU, and takes ``memory_share`` of the GPU's memory (of host
memory on a CPU, where vLLM keeps its KV cache); the transformers engine decodes the model it is
given, where it lies. Callers choose only what differs between training and evaluation (the memory
share, the batch, the continuation mode).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agentenv.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from agentenv.engines.base import GenerationEngine

__all__ = ["ENGINES", "build_engine"]

#: The engine kinds ``model.engine`` and ``agentenv eval --engine`` accept.
ENGINES = ("transformers", "vllm")


def build_engine(
    kind: Literal["transformers", "vllm"],
    *,
    model: torch.nn.Module | None = None,
    path: str | Path | None = None,
    tokenizer: Any = None,
    seed: int = 0,
    max_batch_size: int = 32,
    continuation: str = "keep",
    memory_share: float | None = None,
) -> GenerationEngine:
    """A generation engine serving policy version 0.

    Args:
        kind: ``"transformers"`` or ``"vllm"``.
        model: The policy in memory (transformers: decoded where it lies; vLLM: written to a
            temporary folder first). One of ``model`` and ``path`` (vLLM only) is needed.
        path: A model folder vLLM loads itself (no copy in this process).
        tokenizer: The model's tokenizer (needed with ``model``).
        seed: The engine's sampling seed (each request may carry its own).
        max_batch_size: Most rows decoded together.
        continuation: What an in-flight request does when new weights arrive (``"keep"`` or
            ``"recompute"``; :class:`agentenv.engines.base.ContinuationMode`).
        memory_share: vLLM's ``gpu_memory_utilization``, the share of the GPU's memory (on a CPU, of
            host memory for its KV cache) it takes; None: 0.9 on a GPU, 0.2 on a CPU.

    Raises:
        ConfigError: An unknown ``kind``, neither ``model`` nor ``path`` given, a ``path`` for the
            transformers engine, or vLLM asked for but not installed.
        EngineError: The engine failed to start.
    """
    import torch

    from agentenv.engines.base import ContinuationMode

    if kind not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {kind!r}")
    if (model is None) == (path is None):
        raise ConfigError("build_engine needs exactly one of model (in memory) and path (a model folder)")
    mode = ContinuationMode(continuation)
    gpu = torch.cuda.is_available()
    if kind == "vllm":
        from agentenv.engines.vllm_engine import VLLMEngine

        options: dict[str, Any] = {
            "continuation": mode, "seed": seed, "max_batch_size": max_batch_size,
            "dtype": "bfloat16" if gpu else "auto", "gpu_memory_utilization": memory_share or (0.9 if gpu else 0.2),
        }
        if model is not None:
            return VLLMEngine.from_model(model, tokenizer, **options)
        return VLLMEngine(path, **options)
    if path is not None:
        raise ConfigError("the transformers engine decodes a model in memory: load it, then pass model=")
    from agentenv.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, tokenizer, max_batch_size=max_batch_size, continuation=mode, seed=seed)
