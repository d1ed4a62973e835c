"""Import OpenRLHF 0.11.2's DeepSpeed strategy and policy loss on machines without flash-attn.

OpenRLHF's package ``openrlhf.models`` imports ``openrlhf.models.ring_attn_utils`` at import time,
which does ``from flash_attn.bert_padding import ...`` and ``from flash_attn.utils.distributed import
all_gather``. flash-attn has no CPU build (its wheel needs CUDA to compile), and both
``openrlhf.utils.deepspeed.DeepspeedStrategy`` and ``openrlhf.models.loss.PolicyLoss`` sit behind that
package import. The five names are used only by sample packing and ring attention, which this
backend never enables.

So, **only when the real flash-attn is not installed**, :func:`import_openrlhf` puts a tiny
in-memory stand-in into ``sys.modules`` (nothing is written to site-packages) just for the duration of
OpenRLHF's import, then removes it again: OpenRLHF keeps its references to the five stand-in functions,
which raise :class:`~agentenv.errors.ConfigError` if anything ever calls them, and no other library
sees a ``flash_attn`` module afterwards. On a GPU machine with flash-attn installed the real one is
used and nothing is stubbed.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from agentenv.errors import ConfigError

__all__ = [
    "ensure_flash_attn_importable",
    "flash_attn_is_stubbed",
    "import_openrlhf",
    "remove_flash_attn_stub",
]

_STUB_FLAG = "__agentenv_stub__"


def _unavailable(name: str):
    def fn(*args: Any, **kwargs: Any) -> Any:
        raise ConfigError(
            f"flash_attn.{name} was called, but flash-attn is not installed (CPU machine); sample "
            "packing and ring attention need a CUDA machine with flash-attn"
        )

    fn.__name__ = name
    return fn


def _module(name: str, is_package: bool, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name, "agentenv stand-in: flash-attn is not installed on this machine")
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None, is_package=is_package)
    if is_package:
        mod.__path__ = []  # type: ignore[attr-defined]
    setattr(mod, _STUB_FLAG, True)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


_STUB_MODULES = ("flash_attn", "flash_attn.utils", "flash_attn.bert_padding", "flash_attn.utils.distributed")
_used_stub = False


def flash_attn_is_stubbed() -> bool:
    """True when OpenRLHF was imported against our stand-in (the real flash-attn is missing)."""
    return _used_stub


def ensure_flash_attn_importable() -> bool:
    """Make ``import flash_attn.bert_padding`` / ``flash_attn.utils.distributed`` succeed.

    Call :func:`remove_flash_attn_stub` once the importing is done.

    Returns:
        True if the stand-in is installed in ``sys.modules``, False if the real flash-attn is used.
    """
    if getattr(sys.modules.get("flash_attn"), _STUB_FLAG, False):
        return True
    if "flash_attn" in sys.modules or importlib.util.find_spec("flash_attn") is not None:
        return False
    names = {
        "bert_padding": ("index_first_axis", "pad_input", "rearrange", "unpad_input"),
        "utils.distributed": ("all_gather",),
    }
    sys.modules["flash_attn"] = root = _module("flash_attn", True)
    sys.modules["flash_attn.utils"] = utils = _module("flash_attn.utils", True)
    root.utils = utils  # type: ignore[attr-defined]
    bert = _module("flash_attn.bert_padding", False, **{n: _unavailable(n) for n in names["bert_padding"]})
    dist = _module("flash_attn.utils.distributed", False, all_gather=_unavailable("all_gather"))
    sys.modules["flash_attn.bert_padding"] = bert
    sys.modules["flash_attn.utils.distributed"] = dist
    root.bert_padding = bert  # type: ignore[attr-defined]
    utils.distributed = dist  # type: ignore[attr-defined]
    return True


def remove_flash_attn_stub() -> None:
    """Take the stand-in out of ``sys.modules`` (modules that imported from it keep their references)."""
    for name in _STUB_MODULES:
        if getattr(sys.modules.get(name), _STUB_FLAG, False):
            del sys.modules[name]


def import_openrlhf() -> types.SimpleNamespace:
    """Import the OpenRLHF pieces the backend uses, stubbing flash-attn first if it is missing.

    Returns:
        Namespace with ``DeepspeedStrategy``, ``PolicyLoss``, ``aggregate_loss``,
        ``get_optimizer_grouped_parameters``, ``BaseDistributedActor`` (Ray rendezvous) and
        ``version`` (OpenRLHF's version string).

    Raises:
        ConfigError: OpenRLHF or DeepSpeed is not installed (run ``scripts/install_openrlhf.sh``).
    """
    global _used_stub
    stubbed = ensure_flash_attn_importable()
    try:
        import importlib.metadata as md

        from openrlhf.models.loss import PolicyLoss, aggregate_loss
        from openrlhf.trainer.ray.launcher import BaseDistributedActor
        from openrlhf.utils.deepspeed import DeepspeedStrategy
        from openrlhf.utils.deepspeed.deepspeed_utils import get_optimizer_grouped_parameters
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ConfigError(
            f"the OpenRLHF backend needs openrlhf + deepspeed + ray ({e}); run scripts/install_openrlhf.sh"
        ) from e
    finally:
        if stubbed:
            remove_flash_attn_stub()
    _used_stub = _used_stub or stubbed
    return types.SimpleNamespace(
        DeepspeedStrategy=DeepspeedStrategy,
        PolicyLoss=PolicyLoss,
        aggregate_loss=aggregate_loss,
        BaseDistributedActor=BaseDistributedActor,
        get_optimizer_grouped_parameters=get_optimizer_grouped_parameters,
        version=md.version("openrlhf"),
    )
