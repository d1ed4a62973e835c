"""A policy's LoRA adapters as a peft adapter folder: what peft's ``PeftModel`` and vLLM's LoRA loader read.

The learner's adapted state dict (:mod:`agentenv.trainer.learners.lora`) names each adapter tensor
``<module>.lora_A.<adapter>.weight`` (``(r, d_in)``) and ``<module>.lora_B.<adapter>.weight``
(``(d_out, r)``). A peft adapter folder holds them as ``base_model.model.<module>.lora_A.weight`` in
``adapter_model.safetensors``, beside ``adapter_config.json`` (peft's ``LoraConfig``: rank, alpha,
the adapted modules, the base model). ``agentenv export --adapter`` writes one; the vLLM engine writes
one per policy version and loads it as that version's ``LoRARequest``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["LORA_NAME", "base_state_dict", "peft_adapter", "write_peft_adapter"]

LORA_NAME = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.[^.]+\.weight$")
"""An adapter tensor's name in an adapted model's state dict: ``<module>.lora_<A|B>.<adapter>.weight``."""
_BASE = re.compile(r"\.base_layer\.")


def peft_adapter(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """The adapters of an adapted state dict under peft's names, and the modules they adapt.

    The base weights are left out; a state dict of adapters alone (a weight sync's) is fine too.

    Returns:
        ``(tensors, targets)``: the adapter tensors (contiguous, on the CPU) under
        ``base_model.model.<module>.lora_{A,B}.weight``, and the sorted last name components of the
        adapted layers (``adapter_config.json``'s ``target_modules``).

    Raises:
        ValueError: ``state`` holds no adapter, or an adapted layer lacks one of ``A`` and ``B``.
    """
    tensors: dict[str, torch.Tensor] = {}
    halves: dict[str, set[str]] = {}
    for name, t in state.items():
        m = LORA_NAME.match(name)
        if m:
            tensors[f"base_model.model.{m['module']}.lora_{m['ab']}.weight"] = t.detach().to("cpu").contiguous()
            halves.setdefault(m["module"], set()).add(m["ab"])
    if not halves:
        raise ValueError("the state dict holds no LoRA adapter")
    broken = [module for module, ab in halves.items() if ab != {"A", "B"}]
    if broken:
        raise ValueError(f"adapted layer {broken[0]!r} lacks one of lora_A, lora_B")
    return tensors, sorted({module.rsplit(".", 1)[-1] for module in halves})


def write_peft_adapter(state: Mapping[str, torch.Tensor], folder: Path, *, rank: int, alpha: float,
                       base: str | Path) -> None:
    """``adapter_model.safetensors`` and ``adapter_config.json`` of ``state``'s adapters in ``folder``.

    Args:
        state: An adapted state dict, or its adapter tensors alone.
        folder: An existing folder.
        rank: ``r`` of the adapters.
        alpha: Their scale numerator (the update is ``(alpha / r) B A``).
        base: The base model's name or folder (``base_model_name_or_path``).

    Raises:
        ValueError: As :func:`peft_adapter`.
    """
    from peft import LoraConfig
    from safetensors.torch import save_file

    tensors, targets = peft_adapter(state)
    LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, task_type="CAUSAL_LM",
               base_model_name_or_path=str(base), inference_mode=True).save_pretrained(str(folder))
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def base_state_dict(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's state dict inside an adapted one: the adapters dropped, ``x.base_layer.weight`` as ``x.weight``.

    What an engine that applies the adapters itself (vLLM) loads as its model; a state dict without
    adapters comes back as it is.
    """
    return {_BASE.sub(".", name): t for name, t in state.items() if not LORA_NAME.match(name)}
