"""Per-update metrics to JSON lines and TensorBoard.

``MetricsWriter(run_dir)`` appends one JSON object per :meth:`MetricsWriter.log` call to
``run_dir/metrics.jsonl`` (``{"step": ..., "time": ..., <flat keys>...}``; NaN/inf are written as
null so every line is strict JSON) and writes every numeric value as a TensorBoard scalar under
``run_dir/tb`` (``torch.utils.tensorboard.SummaryWriter``). Nested dicts and dataclasses are
flattened with ``/`` (``{"pool": {"ws_mean": 2}}`` -> ``pool/ws_mean``).

The training loop's row per update is assembled by :func:`agentenv.trainer.setup.update_metrics`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["MetricsWriter", "flatten"]


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Flatten nested mappings/dataclasses into ``a/b`` keys; lists of numbers become their mean.

    Non-numeric leaves (strings, bools stay as values) are kept for JSONL only.
    """
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        data = {f.name: getattr(data, f.name) for f in dataclasses.fields(data)}
    elif hasattr(data, "to_dict") and not isinstance(data, Mapping):
        data = data.to_dict()
    out: dict[str, Any] = {}
    if isinstance(data, Mapping):
        for k, v in data.items():
            key = f"{prefix}/{k}" if prefix else str(k)
            if isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
                out.update(flatten(v, key))
            else:
                out.update(flatten(v, key) if hasattr(v, "to_dict") else {key: _leaf(v)})
        return out
    return {prefix or "value": _leaf(data)}


def _leaf(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "numel", lambda: 1)() == 1:  # torch/numpy scalar
        v = v.item()
    if isinstance(v, (list, tuple)) and v and all(isinstance(x, (int, float)) for x in v):
        return sum(float(x) for x in v) / len(v)
    return v


class MetricsWriter:
    """Append per-step metrics to ``run_dir/metrics.jsonl`` and TensorBoard (``run_dir/tb``).

    Args:
        run_dir: Run folder (created if missing). An existing ``metrics.jsonl`` is appended to, so a
            resumed run continues the same file.
        tensorboard: Also write TensorBoard scalars.
    """

    def __init__(self, run_dir: Path | str, *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.run_dir / "tb"))

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Write one record for ``step`` (policy version or update count).

        Raises:
            agentenv.errors.ClosedError: after :meth:`close`.
        """
        if self._file is None:
            from agentenv.errors import ClosedError

            raise ClosedError("MetricsWriter is closed")
        flat = flatten(metrics)
        rec = {"step": int(step), "time": time.time(), **{k: _json_safe(v) for k, v in flat.items()}}
        self._file.write(json.dumps(rec, allow_nan=False, default=str) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in flat.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(k, v, global_step=int(step))
                elif isinstance(v, bool):
                    self._tb.add_scalar(k, float(v), global_step=int(step))

    def close(self) -> None:
        """Flush and close both outputs. Safe to call twice."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _json_safe(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v
