"""Loading and checking new policy weights before they touch a serving model.

A weight update must be all-or-nothing: every check (file readable, names known, every tensor of the
model covered, shapes equal, values finite) runs before the first parameter is overwritten, so a bad
update leaves the old version serving (:class:`~agentenv.errors.WeightUpdateError`).

A model with LoRA adapters (:mod:`agentenv.trainer.learners.lora`) also takes an adapter-only update: a state dict
whose every name is an adapter tensor's (:func:`is_adapter_name`) and which covers every adapter tensor of
the model; its frozen base weights stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch

from agentenv.errors import WeightUpdateError


def is_adapter_name(name: str) -> bool:
    """Whether a state-dict name is a LoRA adapter tensor's (peft's ``lora_A`` / ``lora_B`` modules)."""
    return ".lora_A." in name or ".lora_B." in name


def load_weights(weights: Mapping[str, torch.Tensor] | str | Path) -> dict[str, torch.Tensor]:
    """Return a state dict from a mapping or a safetensors file (read on the CPU).

    Raises:
        WeightUpdateError: The file is missing or unreadable, or the mapping holds a non-tensor.
    """
    if isinstance(weights, (str, Path)):
        from safetensors.torch import load_file

        try:
            return load_file(str(weights), device="cpu")
        except Exception as exc:  # safetensors raises several kinds; all mean "cannot load"
            raise WeightUpdateError(f"cannot read weights from {weights}: {exc}") from exc
    if not isinstance(weights, Mapping):
        raise WeightUpdateError(
            f"weights must be a state dict or a safetensors path, got {type(weights).__name__}"
        )
    for name, t in weights.items():
        if not isinstance(t, torch.Tensor):
            raise WeightUpdateError(f"weight {name!r} is a {type(t).__name__}, not a tensor")
    return dict(weights)


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Check that ``state`` can replace all of ``model``'s weights, or all of its LoRA adapters.

    Tied tensors (e.g. ``lm_head.weight`` sharing ``model.embed_tokens.weight``) need only one of
    their names. A ``state`` of adapter tensors only (:func:`is_adapter_name`) must cover every adapter
    tensor of the model, and the model must have some.

    Raises:
        WeightUpdateError: Unknown names, a model tensor not covered, a shape mismatch, or a NaN/inf value.
    """
    own = model.state_dict(keep_vars=True)
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise WeightUpdateError(f"{len(unknown)} unknown weight names, e.g. {unknown[:3]}")
    if state and all(is_adapter_name(n) for n in state):  # an adapter-only update: the base stays
        own = {n: t for n, t in own.items() if is_adapter_name(n)}
    groups: dict[int, list[str]] = {}
    for name, t in own.items():
        groups.setdefault(id(t), []).append(name)
    missing = [names[0] for names in groups.values() if not any(n in state for n in names)]
    if missing:
        raise WeightUpdateError(f"{len(missing)} model weights missing from the update, e.g. {missing[:3]}")
    for name, t in state.items():
        if tuple(t.shape) != tuple(own[name].shape):
            raise WeightUpdateError(
                f"weight {name!r} has shape {tuple(t.shape)}, the model needs {tuple(own[name].shape)}"
            )
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise WeightUpdateError(f"weight {name!r} holds NaN or inf values")


@torch.no_grad()
def copy_into(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy a checked state dict into the model's tensors in place (dtype and device converted)."""
    own = model.state_dict(keep_vars=True)
    for name, t in state.items():
        own[name].data.copy_(t)
