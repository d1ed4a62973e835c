"""LoRA adapters on the policy: low-rank updates trained in place of the full weights.

With ``learner.lora_rank = r > 0`` every targeted linear layer ``W`` (``d_out x d_in``) of the policy
gets two trainable matrices, ``A`` (``r x d_in``, Kaiming-uniform at the start) and ``B`` (``d_out x r``,
zeros at the start), and computes ``W x + (alpha / r) B A x`` (Hu et al. 2021, arXiv 2106.09685, eq. 3);
``W`` and every other weight are frozen. The adapters are peft's (``peft.inject_adapter_in_model``): the
model stays the same transformers class, so the learner's forward passes, the shared prefix and the
chunked log-probabilities run unchanged. At the start ``B = 0``, so policy version 0 is the base model.

The generation engine holds a copy of the same adapted model; a weight sync sends the adapter tensors
only (``r * (d_in + d_out)`` per layer instead of ``d_in * d_out``), which
:func:`agentenv.engines.weights.check_state_dict` accepts when they cover every adapter tensor the
engine's model has. A checkpoint holds the whole adapted state dict; ``agentenv export`` writes the merged
weights ``W + (alpha / r) B A`` under the base model's names (:func:`merged_state_dict`), or with
``--adapter`` the adapters alone as peft saves them (:mod:`agentenv.engines.peft_adapter`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from agentenv.engines.peft_adapter import LORA_NAME, base_state_dict
from agentenv.engines.weights import is_adapter_name
from agentenv.errors import ConfigError

__all__ = ["ALL_LINEAR", "add_lora", "adapter_state", "check_targets", "has_adapters", "linear_module_names",
           "merged_state_dict"]

#: ``learner.lora_target_modules`` value for every linear layer except the output projection (peft's name).
ALL_LINEAR = "all-linear"


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last name component of every ``torch.nn.Linear`` in ``model`` (sorted, each once): what LoRA can target."""
    return sorted({name.rsplit(".", 1)[-1] for name, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)})


def add_lora(model: torch.nn.Module, *, rank: int, alpha: float, targets: Sequence[str]) -> torch.nn.Module:
    """Add LoRA adapters to ``model`` in place, freeze every other weight, and return ``model``.

    Args:
        model: A transformers causal LM (float32 or bf16; the adapters take its dtype and device).
        rank: ``r`` (>= 1).
        alpha: The scale numerator: the update is ``(alpha / r) B A``.
        targets: Last name components of the linear layers to adapt (``q_proj``, ``v_proj``, ...), or
            ``("all-linear",)``: every linear layer except the output projection.

    Raises:
        ConfigError: ``rank < 1``, ``alpha <= 0``, or a target that names no linear layer of the model
            (the message lists the ones it has).
    """
    from peft import LoraConfig, inject_adapter_in_model

    if rank < 1:
        raise ConfigError(f"learner.lora_rank must be >= 1 for LoRA (0: full fine-tuning), got {rank}")
    if not alpha > 0:
        raise ConfigError(f"learner.lora_alpha must be > 0, got {alpha}")
    names = check_targets(model, targets)
    target: str | list[str] = ALL_LINEAR if names == [ALL_LINEAR] else names
    # no dropout: the learner's log-probabilities must be those of the policy the engine samples
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, target_modules=target, lora_dropout=0.0), model)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter_name(name))
    return model


def check_targets(model: torch.nn.Module, targets: Sequence[str]) -> list[str]:
    """``targets`` as a list, once each names a linear layer of ``model`` (or is ``["all-linear"]``).

    Raises:
        ConfigError: No target, or a target that names no linear layer of the model (the message lists
            the ones it has).
    """
    names = list(targets)
    if not names:
        raise ConfigError(f"learner.lora_target_modules is empty: name linear layers or {ALL_LINEAR!r}")
    if names != [ALL_LINEAR]:
        have = linear_module_names(model)
        unknown = [n for n in names if n not in have]
        if unknown:
            raise ConfigError(f"learner.lora_target_modules: the model has no linear layer named "
                              f"{', '.join(unknown)}; it has {', '.join(have)} (or use {ALL_LINEAR!r})")
    return names


def has_adapters(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds LoRA adapter tensors."""
    return any(is_adapter_name(name) for name, _ in model.named_parameters())


def adapter_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Detached CPU copies of ``model``'s adapter tensors, under its own state-dict names."""
    return {k: v.detach().to("cpu", copy=True).contiguous()
            for k, v in model.state_dict().items() if is_adapter_name(k)}


def merged_state_dict(state: Mapping[str, torch.Tensor], *, rank: int, alpha: float) -> dict[str, torch.Tensor]:
    """The plain model's state dict from an adapted one: ``W + (alpha / rank) B A`` under ``W``'s own name.

    ``state`` is an adapted model's state dict (``x.base_layer.weight``, ``x.lora_A.<adapter>.weight``
    ``(r, d_in)``, ``x.lora_B.<adapter>.weight`` ``(d_out, r)``); the merge is computed in float32 and
    stored in the base weight's dtype. A state dict without adapters comes back unchanged.

    Raises:
        ValueError: An adapted layer lacks its base weight or one of ``A`` and ``B``.
    """
    out = base_state_dict(state)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in state.items():
        if m := LORA_NAME.match(name):
            pairs.setdefault(m["module"], {})[m["ab"]] = t
    scale = alpha / rank
    for module, ab in pairs.items():
        base = out.get(f"{module}.weight")
        if base is None or set(ab) != {"A", "B"}:
            raise ValueError(f"adapted layer {module!r} lacks its base weight or one of lora_A, lora_B")
        delta = ab["B"].float() @ ab["A"].float()
        out[f"{module}.weight"] = (base.float() + scale * delta).to(base.dtype)
    return out

