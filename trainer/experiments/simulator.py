"""A discrete-event simulator of the asynchronous rollout/learner pipeline and its staleness policies.

What is modelled (all times in seconds, lengths in tokens, versions in optimizer steps):

* ``concurrency`` episodes are in flight (asynchronous policies; a finished slot starts a new episode
  at once). An episode has ``1 + Poisson(turns_mean - 1)`` turns; its policy tokens are lognormal
  (mean ``tokens_mean``) split evenly over the turns; between turns a tool call takes a lognormal
  latency (mean ``tool_latency_mean_s``) and returns ``obs_tokens`` environment tokens.
* One engine decodes every generating sequence at ``min(slot_tokens_per_s, engine_tokens_per_s / n)``
  tokens/s each (batched decoding shared equally by the ``n`` sequences decoding now; processor
  sharing, simulated exactly with a virtual clock).
* The learner takes a batch of ``batch_size`` from a real :class:`~agentenv.pool.TrajectoryPool`,
  trains for ``train_step_s``, then the version increments and the weights go to the engine:
  generation pauses ``weight_sync_s`` and every in-flight sequence is interrupted at a token boundary
  and continues under the new version with its KV cache kept (KEEP mode: the new segment's
  ``prefix_version`` stays the old one). A turn that starts after a tool call recomputes its prefix
  (``prefix_version == version``), as the engine resets its prefix cache on a version change.
* ``sync``: no overlap. ``batch_size`` episodes (at most ``concurrency`` at once) are generated under
  one version, then the learner trains while the engine idles; GS = WS = 0 by construction.
* Rejected trajectories' tasks are requeued (taken before new tasks).
* PACE's scoring mode needs the current learner's log-probabilities. The simulator models the drift of
  a token sampled ``lag = v_now - v_t`` versions ago as ``|log pi_now - log mu| = drift_scale * lag *
  eps_i`` with ``eps_i ~ LogNormal(0, drift_noise_sigma)`` drawn once per trajectory (how sensitive its
  content is to the policy change): a noisy, increasing function of the version lag. Behaviour
  log-probabilities are a constant -1 nats.
* Episode lengths are drawn afresh for each episode, also for a requeued task.

Everything is driven by one ``numpy`` generator seeded with ``seed``: a run is deterministic.
"""

from __future__ import annotations

import heapq
import math
import sys
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Literal, get_args

import numpy as np

from agentenv.errors import ConfigError
from agentenv.pool import TrajectoryPool
from agentenv.staleness import StalenessConfig
from agentenv.trajectory import Segment, Trajectory

PolicyChoice = Literal["sync", "none", "max_lag", "pace", "pace_share", "all"]
"""The ``--policy`` values; ``agentenv simulate --help`` lists them and rejects anything else."""
SIM_POLICIES: tuple[str, ...] = tuple(p for p in get_args(PolicyChoice) if p != "all")
"""The simulated staleness policies, in table order (``all`` runs each of them)."""


@dataclass(frozen=True)
class SimConfig:
    """Pipeline simulator settings (``agentenv simulate``)."""

    policy: PolicyChoice = "pace"
    """One of ``sync``, ``none``, ``max_lag``, ``pace`` (scoring drift), ``pace_share`` (token-share
    drift), or ``all`` (CLI only: run every policy and print a comparison table)."""
    batch_size: int = 64
    """B, trajectories per optimizer step."""
    concurrency: int = 256
    """Episodes in flight at once."""
    num_trajectories: int = 10_000
    """Stop once this many episodes have completed."""
    seed: int = 0
    """Seed of the simulation's random generator."""
    tokens_mean: float = 1024.0
    """Mean policy tokens per episode (lognormal)."""
    tokens_sigma: float = 1.0
    """Lognormal shape (std of log length) of the policy tokens per episode."""
    tokens_max: int = 16_384
    """Cap on policy tokens per episode."""
    turns_mean: float = 3.0
    """Mean turns per episode (``1 + Poisson(turns_mean - 1)``, at most one turn per token)."""
    tool_latency_mean_s: float = 2.0
    """Mean tool-call latency between turns, seconds (lognormal)."""
    tool_latency_sigma: float = 1.0
    """Lognormal shape of the tool latency."""
    prompt_tokens: int = 256
    """Environment tokens of the first prompt."""
    obs_tokens: int = 64
    """Environment tokens per tool observation."""
    engine_tokens_per_s: float = 12_000.0
    """Engine-wide decoding throughput, tokens/s, shared by the sequences decoding now."""
    slot_tokens_per_s: float = 80.0
    """Fastest decoding of one sequence, tokens/s."""
    train_step_s: float = 6.0
    """Learner time per optimizer step, seconds."""
    weight_sync_s: float = 0.5
    """Generation pause per weight update, seconds."""
    max_lag: float = 4.0
    """``max_lag`` policy cap (versions) on the lag of a trajectory's oldest token ."""
    gamma: float = 4.0
    """PACE weight exponent."""
    beta: float = 0.9
    """PACE rate smoothing."""
    target_occupancy: int | None = None
    """PACE target occupancy (None: B)."""
    drift_scale: float = 0.02
    """Simulated prefix drift per version of lag, nats."""
    drift_noise_sigma: float = 0.75
    """Lognormal shape of the per-trajectory drift sensitivity."""

    def __post_init__(self) -> None:
        """Validate.

        Raises:
            ConfigError: A value is out of range.
        """
        if self.policy not in SIM_POLICIES + ("all",):
            raise ConfigError(f"policy must be one of {SIM_POLICIES + ('all',)}, got {self.policy!r}")
        for name in ("batch_size", "concurrency", "num_trajectories", "tokens_max", "prompt_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        if self.obs_tokens < 0:
            raise ConfigError(f"obs_tokens must be >= 0, got {self.obs_tokens}")
        for name in ("tokens_mean", "turns_mean", "engine_tokens_per_s", "slot_tokens_per_s", "train_step_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.tokens_mean < 1:
            raise ConfigError(f"tokens_mean must be >= 1 token, got {self.tokens_mean}")
        if self.turns_mean < 1:
            raise ConfigError(f"turns_mean must be >= 1, got {self.turns_mean}")
        for name in ("tokens_sigma", "tool_latency_mean_s", "tool_latency_sigma", "weight_sync_s",
                     "drift_scale", "drift_noise_sigma"):
            if not getattr(self, name) >= 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)}")
        self.staleness_config()  # validates the pool's hyper-parameters too

    def staleness_config(self) -> StalenessConfig:
        """The pool's :class:`StalenessConfig` for this policy (``pace_share`` -> token-share drift)."""
        policy = "pace" if self.policy in ("pace_share", "all") else self.policy
        return StalenessConfig(
            policy=policy, max_lag=self.max_lag, gamma=self.gamma, beta=self.beta,
            target_occupancy=self.target_occupancy,
            drift_mode="token_share" if self.policy == "pace_share" else "scoring",
        )


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
    engine_utilization: float
    """Time-average of decoded tokens/s over ``engine_tokens_per_s``."""
    trainer_busy: float
    tokens_generated: int
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
            "gs_mean": float(self.gs.mean()) if self.gs.size else 0.0, "gs_p90": pct(self.gs, 90),
            "ws_mean": float(self.ws.mean()) if self.ws.size else 0.0, "ws_p90": pct(self.ws, 90),
            "s_mean": float(s.mean()) if s.size else 0.0, "s_p50": pct(s, 50), "s_p90": pct(s, 90),
            "s_p99": pct(s, 99), "s_max": float(s.max()) if s.size else 0.0,
            "rejection_rate": self.rejection_rate,
            "occupancy_mean": float(occ.mean()) if occ.size else 0.0, "occupancy_p90": pct(occ, 90),
            "occupancy_time_mean": self.occupancy_time_mean,
            "generator_busy": self.generator_busy, "engine_utilization": self.engine_utilization,
            "trainer_busy": self.trainer_busy,
        }


@dataclass
class _Episode:
    task_id: str
    turns: list[int]
    start_version: int
    start_time: float
    sensitivity: float
    turn: int = 0
    pieces: list[list[tuple[int, int, int]]] = field(default_factory=list)  # per turn: (n, v, prefix_v)
    version: int = 0
    prefix_version: int = 0
    piece_start: int = 0
    v_turn_start: float = 0.0


class _Sim:
    """One run's mutable state; :func:`simulate` is the public entry."""

    def __init__(self, cfg: SimConfig, keep_decisions: bool) -> None:
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg.seed)
        self.pool = TrajectoryPool(cfg.staleness_config())
        self.sync = cfg.policy == "sync"
        self.keep_decisions = keep_decisions
        self.now = 0.0
        self.vclock = 0.0  # virtual decoding clock: tokens decoded by every generating sequence
        self.version = 0  # learner version; the engine loads it at once (decoding pauses weight_sync_s)
        self.paused = False
        self.gen: list[tuple[float, int, int]] = []  # (virtual finish, seq, slot) of decoding sequences
        self.events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, slot)
        self.seq = 0
        self.episodes: dict[int, _Episode] = {}
        self.requeue: deque[str] = deque()
        self.next_task = 0
        self.completed = 0
        self.training = False
        self.sync_started = 0  # sync: episodes started for the current batch
        self.gs: list[np.ndarray] = []
        self.ws: list[np.ndarray] = []
        self.occ: list[int] = []
        self.occ_series: list[tuple[float, int]] = []
        self.decisions: list[dict[str, Any]] = []
        self.rejected = 0
        self.consumed = 0
        self.tokens = 0
        self.t_gen_busy = self.t_train = self.occ_area = self.tok_area = 0.0

    # -- helpers ----------------------------------------------------------------------------------
    def push(self, t: float, kind: str, slot: int = -1) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, slot))

    def rate(self) -> float:
        n = len(self.gen)
        if n == 0 or self.paused:
            return 0.0
        return min(self.cfg.slot_tokens_per_s, self.cfg.engine_tokens_per_s / n)

    def start_episode(self, slot: int) -> None:
        cfg, rng = self.cfg, self.rng
        if self.requeue:
            task = self.requeue.popleft()
        else:
            task, self.next_task = f"task-{self.next_task}", self.next_task + 1
        mu = math.log(cfg.tokens_mean) - cfg.tokens_sigma**2 / 2
        drawn = rng.lognormal(mu, cfg.tokens_sigma) if cfg.tokens_sigma else cfg.tokens_mean
        total = int(min(cfg.tokens_max, max(1.0, drawn)))
        n_turns = min(total, 1 + int(rng.poisson(cfg.turns_mean - 1)))
        base, extra = divmod(total, n_turns)
        turns = [base + (1 if i < extra else 0) for i in range(n_turns)]
        sens = float(rng.lognormal(0.0, cfg.drift_noise_sigma)) if cfg.drift_noise_sigma else 1.0
        self.episodes[slot] = _Episode(task, turns, self.version, self.now, sens)
        self.start_turn(slot)

    def start_turn(self, slot: int) -> None:
        ep = self.episodes[slot]
        ep.pieces.append([])
        ep.version = ep.prefix_version = self.version  # prefix recomputed under the current weights
        ep.piece_start = 0
        ep.v_turn_start = self.vclock
        self.seq += 1
        heapq.heappush(self.gen, (self.vclock + ep.turns[ep.turn], self.seq, slot))

    def split_inflight(self) -> None:
        """Interrupt every decoding sequence at the token the update landed on (KEEP mode)."""
        for _, _, slot in self.gen:
            ep = self.episodes[slot]
            done = min(ep.turns[ep.turn], int(self.vclock - ep.v_turn_start + 1e-9))
            if done > ep.piece_start:
                ep.pieces[ep.turn].append((done - ep.piece_start, ep.version, ep.prefix_version))
                ep.piece_start = done
            ep.version = self.version  # prefix_version stays: the KV cache survived

    def finish_turn(self, slot: int) -> None:
        ep = self.episodes[slot]
        n = ep.turns[ep.turn] - ep.piece_start
        if n > 0:
            ep.pieces[ep.turn].append((n, ep.version, ep.prefix_version))
        self.tokens += ep.turns[ep.turn]
        ep.turn += 1
        if ep.turn < len(ep.turns):
            cfg = self.cfg
            mu = math.log(max(cfg.tool_latency_mean_s, 1e-9)) - cfg.tool_latency_sigma**2 / 2
            lat = float(self.rng.lognormal(mu, cfg.tool_latency_sigma)) if cfg.tool_latency_mean_s else 0.0
            self.push(self.now + lat, "tool", slot)
        else:
            self.complete(slot)

    def complete(self, slot: int) -> None:
        ep = self.episodes.pop(slot)
        cfg = self.cfg
        total = sum(ep.turns)
        length = cfg.prompt_tokens + total + cfg.obs_tokens * (len(ep.turns) - 1)
        ids, mask, blp = [0] * length, [0] * length, [0.0] * length
        segs: list[Segment] = []
        pos = cfg.prompt_tokens
        for k, pieces in enumerate(ep.pieces):
            pos += cfg.obs_tokens if k else 0
            for n, v, pv in pieces:
                segs.append(Segment(pos, pos + n, v, pv))
                ids[pos : pos + n] = [1] * n
                mask[pos : pos + n] = [1] * n
                blp[pos : pos + n] = [-1.0] * n
                pos += n
        traj = Trajectory(
            token_ids=ids, loss_mask=mask, behaviour_logprobs=blp, segments=segs,
            prompt_length=cfg.prompt_tokens, task_id=ep.task_id, start_version=ep.start_version,
            completion_version=self.version, start_time=ep.start_time, completion_time=self.now,
            info={"drift_sensitivity": ep.sensitivity}, id=f"traj-{self.completed}",
        )
        self.pool.add(traj)
        self.completed += 1
        if self.sync:
            if self.sync_started < cfg.batch_size:
                self.sync_started += 1
                self.start_episode(slot)
        else:
            self.start_episode(slot)

    def scorer(self, trajs: list[Trajectory]) -> list[np.ndarray]:
        """Simulated current log-probs: mu - drift_scale * (v_now - v_t) * eps_i per policy token."""
        out = []
        for t in trajs:
            lag = np.repeat(
                np.array([self.version - s.version for s in t.segments], dtype=np.float64),
                [s.num_tokens for s in t.segments],
            )
            out.append(-1.0 - self.cfg.drift_scale * lag * t.info["drift_sensitivity"])
        return out

    def try_train(self) -> None:
        cfg = self.cfg
        if self.training or len(self.pool) < cfg.batch_size:
            return
        self.occ.append(len(self.pool))
        self.occ_series.append((self.now, len(self.pool)))
        sel = self.pool.select_batch(cfg.batch_size, self.version, self.scorer)
        d = sel.decision
        if self.keep_decisions:
            self.decisions.append(d.to_dict())
        self.rejected += len(sel.rejected)
        self.requeue.extend(sel.requeue_task_ids)
        if not sel.batch:
            return
        self.consumed += len(sel.batch)
        self.gs.append(d.sel["gs"])
        self.ws.append(d.sel["ws"])
        self.training = True
        self.push(self.now + cfg.train_step_s, "train_done")

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg = self.cfg
        first = min(cfg.concurrency, cfg.batch_size) if self.sync else cfg.concurrency
        for slot in range(first):
            self.start_episode(slot)
        self.sync_started = first
        while self.completed < cfg.num_trajectories:
            r = self.rate()
            t_gen = self.now + (self.gen[0][0] - self.vclock) / r if r > 0 else math.inf
            t_evt = self.events[0][0] if self.events else math.inf
            t = min(t_gen, t_evt)
            if t == math.inf:
                raise RuntimeError("simulator stalled: nothing in flight and nothing scheduled")
            dt = t - self.now
            if r > 0:
                self.vclock += r * dt
                self.t_gen_busy += dt
                self.tok_area += r * len(self.gen) * dt
            if self.training:
                self.t_train += dt
            self.occ_area += len(self.pool) * dt
            self.now = t
            if t_gen <= t_evt:
                _, _, slot = heapq.heappop(self.gen)
                self.finish_turn(slot)
                self.try_train()
                continue
            _, _, kind, slot = heapq.heappop(self.events)
            if kind == "tool":
                self.start_turn(slot)
            elif kind == "train_done":
                self.training = False
                self.version += 1
                self.split_inflight()
                if cfg.weight_sync_s > 0:  # nothing decodes until the new weights are loaded
                    self.paused = True
                    self.push(self.now + cfg.weight_sync_s, "sync_done")
                else:
                    self.after_update()
            elif kind == "sync_done":
                self.paused = False
                self.after_update()
        T = max(self.now, 1e-12)
        return SimResult(
            policy=cfg.policy, sim_time_s=self.now, updates=self.version, completed=self.completed,
            consumed=self.consumed, rejected=self.rejected,
            gs=np.concatenate(self.gs) if self.gs else np.zeros(0),
            ws=np.concatenate(self.ws) if self.ws else np.zeros(0),
            occupancy_at_select=np.asarray(self.occ, dtype=np.float64), occupancy_series=self.occ_series,
            occupancy_time_mean=self.occ_area / T, generator_busy=self.t_gen_busy / T,
            engine_utilization=self.tok_area / T / cfg.engine_tokens_per_s, trainer_busy=self.t_train / T,
            tokens_generated=self.tokens, decisions=self.decisions,
        )

    def after_update(self) -> None:
        if self.sync:  # next synchronous batch: generate B fresh episodes under the new version
            start = min(self.cfg.concurrency, self.cfg.batch_size)
            free = [s for s in range(self.cfg.concurrency) if s not in self.episodes][:start]
            for slot in free:
                self.start_episode(slot)
            self.sync_started = len(free)
        self.try_train()


def simulate(cfg: SimConfig, keep_decisions: bool = False) -> SimResult:
    """Run one simulated pipeline until ``cfg.num_trajectories`` episodes have completed.

    Args:
        cfg: Settings; ``cfg.policy`` must not be ``"all"`` (use :func:`compare`).
        keep_decisions: Keep every pool decision record (memory grows with the run).

    Returns:
        The measured :class:`SimResult`.

    Raises:
        ConfigError: ``cfg.policy == "all"``.
    """
    if cfg.policy == "all":
        raise ConfigError("simulate() runs one policy; use compare() for 'all'")
    return _Sim(cfg, keep_decisions).run()


def compare(cfg: SimConfig, policies: tuple[str, ...] = SIM_POLICIES) -> list[SimResult]:
    """Run :func:`simulate` once per policy with otherwise identical settings and seed."""
    return [simulate(replace(cfg, policy=p)) for p in policies]


def format_table(results: list[SimResult]) -> str:
    """A fixed-width comparison table of :meth:`SimResult.summary` figures, one row per policy."""
    cols = [("policy", None), ("upd/h", "updates_per_hour"), ("GS", "gs_mean"), ("WS", "ws_mean"),
            ("S mean", "s_mean"), ("S p90", "s_p90"), ("S max", "s_max"), ("reject%", "rejection_rate"),
            ("pool", "occupancy_mean"), ("gen busy", "generator_busy"), ("eng util", "engine_utilization"),
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


def main(argv: list[str] | None = None) -> int:
    """``agentenv simulate``: run the simulator and print its figures (a table for ``--policy all``).

    Args:
        argv: Command-line arguments (``sys.argv[1:]`` when None); one flag per :class:`SimConfig` field.

    Returns:
        0 on success (and for ``--help``), 2 on a bad flag or configuration value (message on stderr).
    """
    import tyro

    try:
        cfg = tyro.cli(SimConfig, args=argv, prog="agentenv simulate",
                       description="Simulate the asynchronous RL pipeline.")
    except ConfigError as e:
        print(f"agentenv simulate: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:  # tyro reports parse errors (and --help) itself, then exits
        return e.code if isinstance(e.code, int) else 2
    results = compare(cfg) if cfg.policy == "all" else [simulate(cfg)]
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
