"""What one simulated run of the asynchronous pipeline measured (:mod:`agentenv.trainer.experiments.simulator`).

:class:`SimResult` holds the per-trajectory staleness (policy versions), the pool's occupancy and the
engine's and learner's busy shares; :meth:`SimResult.summary` condenses it into scalar figures and
:func:`format_table` lays several runs side by side, one row per staleness policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentenv.errors import ConfigError


@dataclass
class SimResult:
    """What one simulated run measured.

    Staleness arrays are per consumed trajectory at the moment its batch was built (policy versions).
    """

    policy: str
    sim_time_s: float
    updates: int
    completed: int
    consumed: int
    rejected: int
    gs: np.ndarray
    ws: np.ndarray
    occupancy_at_select: np.ndarray
    """Pool occupancy (trajectories) just before each selection."""
    occupancy_series: list[tuple[float, int]]
    """``(time_s, occupancy)`` at each selection: the pool occupancy over time."""
    occupancy_time_mean: float
    generator_busy: float
    """Share of time the engine was decoding at least one sequence."""
    tokens_per_s: float
    """Decoded tokens per second, averaged over the whole run."""
    trainer_busy: float
    tokens_generated: int
    episode_s: np.ndarray
    """Seconds from start to completion of every completed episode."""
    batches: int = 0
    """Batches consumed, with and without a step (``updates`` counts the steps)."""
    decisions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def s(self) -> np.ndarray:
        """Token-averaged staleness ``S = GS + WS`` per consumed trajectory."""
        return self.gs + self.ws

    @property
    def rejection_rate(self) -> float:
        """Rejected / (rejected + consumed)."""
        d = self.rejected + self.consumed
        return self.rejected / d if d else 0.0

    @property
    def updates_per_hour(self) -> float:
        """Optimizer steps per simulated hour."""
        return self.updates / self.sim_time_s * 3600.0 if self.sim_time_s > 0 else 0.0

    @property
    def batches_per_hour(self) -> float:
        """Batches consumed per simulated hour (with or without a step)."""
        return self.batches / self.sim_time_s * 3600.0 if self.sim_time_s > 0 else 0.0

    def histograms(self, bin_width: float = 0.5) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """``{"gs"|"ws"|"s": (counts, edges)}``: staleness histograms with ``bin_width``-version bins from 0.

        Raises:
            ConfigError: ``bin_width <= 0``.
        """
        if not bin_width > 0:
            raise ConfigError(f"bin_width must be > 0, got {bin_width}")
        out = {}
        for name, a in (("gs", self.gs), ("ws", self.ws), ("s", self.s)):
            top = float(a.max()) if a.size else 0.0
            edges = np.arange(0.0, top + 2 * bin_width, bin_width)
            out[name] = np.histogram(a, bins=edges)
        return out

    def summary(self) -> dict[str, float]:
        """Scalar figures: means and percentiles of GS, WS, S; occupancy; rejection; utilization."""
        def pct(a: np.ndarray, q: float) -> float:
            return float(np.percentile(a, q)) if a.size else 0.0

        s, occ = self.s, self.occupancy_at_select
        return {
            "updates_per_hour": self.updates_per_hour, "updates": self.updates,
            "batches_per_hour": self.batches_per_hour,
            "gs_mean": float(self.gs.mean()) if self.gs.size else 0.0, "gs_p90": pct(self.gs, 90),
            "ws_mean": float(self.ws.mean()) if self.ws.size else 0.0, "ws_p90": pct(self.ws, 90),
            "s_mean": float(s.mean()) if s.size else 0.0, "s_p50": pct(s, 50), "s_p90": pct(s, 90),
            "s_p99": pct(s, 99), "s_max": float(s.max()) if s.size else 0.0,
            "rejection_rate": self.rejection_rate,
            "occupancy_mean": float(occ.mean()) if occ.size else 0.0, "occupancy_p90": pct(occ, 90),
            "occupancy_time_mean": self.occupancy_time_mean,
            "generator_busy": self.generator_busy, "tokens_per_s": self.tokens_per_s,
            "trainer_busy": self.trainer_busy,
            "episode_s_mean": float(self.episode_s.mean()) if self.episode_s.size else 0.0,
        }



def format_table(results: list[SimResult]) -> str:
    """A fixed-width comparison table of :meth:`SimResult.summary` figures, one row per policy."""
    cols = [("policy", None), ("upd/h", "updates_per_hour"), ("GS", "gs_mean"), ("WS", "ws_mean"),
            ("S mean", "s_mean"), ("S p90", "s_p90"), ("S max", "s_max"), ("reject%", "rejection_rate"),
            ("pool", "occupancy_mean"), ("gen busy", "generator_busy"), ("tok/s", "tokens_per_s"),
            ("train busy", "trainer_busy")]
    lines = ["  ".join(f"{h:>10}" for h, _ in cols)]
    for r in results:
        s = r.summary()
        cells = []
        for _, k in cols:
            if k is None:
                cells.append(f"{r.policy:>10}")
            elif k in ("rejection_rate",):
                cells.append(f"{100 * s[k]:>10.1f}")
            else:
                cells.append(f"{s[k]:>10.2f}")
        lines.append("  ".join(cells))
    return "\n".join(lines)
