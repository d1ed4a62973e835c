"""A discrete-event simulator of the asynchronous rollout/learner pipeline and its staleness policies.

What is modelled (all times in seconds, lengths in tokens, versions in optimizer steps):

* ``concurrency`` episodes are in flight (asynchronous policies; a finished slot starts a new episode
  at once, unless ``max_pool_size`` trajectories wait in the pool or play, as in the trainer: then it
  starts once a selection made room). An episode has ``1 + Poisson(turns_mean - 1)`` turns; its
  policy tokens are lognormal (mean ``tokens_mean``) split evenly over the turns; between turns a
  tool call takes a lognormal latency (mean ``tool_latency_mean_s``) and returns ``obs_tokens``
  environment tokens. An
  :class:`EpisodeSample` (lengths measured in a real run) replaces the lognormal and Poisson draws.
* One engine decodes every generating sequence together, one token each per decode step, and a step
  with ``n`` sequences takes ``decode_base_s + decode_per_seq_s * n`` seconds (batched decoding: a
  fixed cost to read the weights, a cost per sequence for its KV cache; simulated exactly with a
  virtual clock).
* The learner takes a batch of ``batch_size`` from a real :class:`~agentenv.rollout.pool.TrajectoryPool`,
  trains for ``train_step_s``, then the version increments and the weights go to the engine:
  generation pauses ``weight_sync_s`` and every in-flight sequence is interrupted at a token boundary
  and continues under the new version with its KV cache kept (KEEP mode: the new segment's
  ``prefix_version`` stays the old one). With ``weight_copy_s`` the learner first copies the weights
  for that long (busy, its version already moved on) while the engine still samples the old ones. A
  turn that starts after a tool call recomputes its prefix (``prefix_version == version``), as the
  engine resets its prefix cache on a version change. A
  share ``no_step_share`` of the batches carry no gradient (every reward equal): they take no learner
  time and no version, as in the trainer. After a step the learner takes ``step_overhead_s`` more
  before its next batch (checks and logs), with generation going on.
* Shared compute (a CPU running both): while the learner trains, decode steps take
  ``train_slows_decode`` times longer; while the engine decodes, the learner's step progresses
  ``decode_slows_train`` times slower. Both are 1 for an engine and a learner on their own devices.
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
from agentenv.rollout.pool import TrajectoryPool
from agentenv.rollout.staleness import StalenessConfig
from agentenv.trainer.experiments.sim_result import SimResult, format_table
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
    max_batches: int | None = None
    """Stop once this many batches are consumed and the last one's step (and weight sync) is done, if
    that comes before ``num_trajectories`` (None: stop at ``num_trajectories`` only)."""
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
    decode_base_s: float = 0.0125
    """Seconds of one decode step, the part that does not grow with the sequences decoded (reading the
    weights): one sequence alone decodes at most ``1 / decode_base_s`` tokens/s."""
    decode_per_seq_s: float = 4e-5
    """Seconds a decode step grows per sequence decoded in it: the engine's throughput approaches
    ``1 / decode_per_seq_s`` tokens/s as sequences are added (about 11,000 tokens/s with 256)."""
    train_step_s: float = 6.0
    """Learner time per optimizer step with the engine idle, seconds."""
    weight_sync_s: float = 0.5
    """Generation pause per weight update, seconds."""
    weight_copy_s: float = 0.0
    """Learner seconds after each step before the weight sync (the copy of the weights for the engine),
    during which the learner's version has moved on and the engine still samples the old weights:
    episodes completing then count one more version of generation staleness, as in the trainer."""
    step_overhead_s: float = 0.0
    """Seconds after each step (and weight sync) before the learner takes its next batch, generation
    going on meanwhile: checks, logging, checkpoints (in the trainer: the sampling check and the logs)."""
    max_pool_size: int | None = None
    """Back-pressure: no episode starts while this many trajectories wait in the pool (None: no limit)."""
    no_step_share: float = 0.0
    """Share of batches without gradient (every reward equal): no learner time, no new version."""
    train_slows_decode: float = 1.0
    """Decode steps take this many times longer while the learner trains (shared compute; >= 1)."""
    decode_slows_train: float = 1.0
    """The learner's step progresses this many times slower while the engine decodes (shared compute; >= 1)."""
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
        ints = ("batch_size", "concurrency", "num_trajectories", "tokens_max", "prompt_tokens")
        optional = tuple(n for n in ("max_pool_size", "max_batches") if getattr(self, n) is not None)
        for name in ints + optional:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an int >= 1, got {v!r}")
        if self.obs_tokens < 0:
            raise ConfigError(f"obs_tokens must be >= 0, got {self.obs_tokens}")
        for name in ("tokens_mean", "turns_mean", "train_step_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        a, b = self.decode_base_s, self.decode_per_seq_s
        if not (a >= 0 and b >= 0 and a + b > 0):
            raise ConfigError("decode_base_s and decode_per_seq_s must be >= 0 and not both 0, got "
                              f"{self.decode_base_s} and {self.decode_per_seq_s}")
        if self.max_pool_size is not None and self.max_pool_size < self.batch_size:
            raise ConfigError(f"max_pool_size ({self.max_pool_size}) must be >= batch_size ({self.batch_size})")
        if not 0.0 <= self.no_step_share < 1.0:
            raise ConfigError(f"no_step_share must be in [0, 1), got {self.no_step_share}")
        for name in ("train_slows_decode", "decode_slows_train"):
            if not getattr(self, name) >= 1.0:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tokens_mean < 1:
            raise ConfigError(f"tokens_mean must be >= 1 token, got {self.tokens_mean}")
        if self.turns_mean < 1:
            raise ConfigError(f"turns_mean must be >= 1, got {self.turns_mean}")
        for name in ("tokens_sigma", "tool_latency_mean_s", "tool_latency_sigma", "weight_sync_s", "weight_copy_s",
                     "step_overhead_s",
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


@dataclass(frozen=True)
class EpisodeSample:
    """Episode lengths measured in a real run, drawn from (with replacement) instead of the lognormal.

    Attributes:
        policy_tokens: ``[n]`` policy tokens per episode (int >= 1).
        turns: ``[n]`` turns per episode (int >= 1); an episode's tokens are split evenly over them
            unless ``turn_tokens`` gives the split.
        turn_tokens: Per episode, its policy tokens per turn (summing to ``policy_tokens``, one entry
            per turn), or None.

    Raises:
        ConfigError: Empty, of different lengths, a value below 1, or a split that does not add up.
    """

    policy_tokens: np.ndarray
    turns: np.ndarray
    turn_tokens: tuple[tuple[int, ...], ...] | None = None

    def __post_init__(self) -> None:
        tokens, turns = np.asarray(self.policy_tokens), np.asarray(self.turns)
        if tokens.ndim != 1 or tokens.shape != turns.shape or tokens.size == 0:
            raise ConfigError("an episode sample needs two non-empty 1-d arrays of one length, "
                              f"got {tokens.shape} and {turns.shape}")
        if tokens.min() < 1 or turns.min() < 1:
            raise ConfigError("an episode sample's policy tokens and turns must be >= 1")
        if self.turn_tokens is not None and (
            len(self.turn_tokens) != tokens.size
            or any(sum(t) != n or len(t) != k or min(t) < 0
                   for t, n, k in zip(self.turn_tokens, tokens, turns, strict=True))
        ):
            raise ConfigError("an episode sample's turn_tokens must give every episode's tokens per turn")

    def draw(self, rng: np.random.Generator) -> list[int]:
        """One episode's policy tokens per turn.

        The measured split, else its tokens split evenly over its turns (at most one turn per token).
        """
        i = int(rng.integers(len(self.policy_tokens)))
        if self.turn_tokens is not None:
            return list(self.turn_tokens[i])
        return even_split(int(self.policy_tokens[i]), int(self.turns[i]))


def even_split(total: int, turns: int) -> list[int]:
    """``total`` tokens over ``min(turns, total)`` turns, the first ones one token longer where it does not divide."""
    turns = min(total, turns)
    base, extra = divmod(total, turns)
    return [base + (1 if i < extra else 0) for i in range(turns)]


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

    def __init__(self, cfg: SimConfig, keep_decisions: bool, episodes: EpisodeSample | None = None) -> None:
        self.cfg = cfg
        self.sample = episodes
        self.rng = np.random.default_rng(cfg.seed)
        self.pool = TrajectoryPool(cfg.staleness_config())
        self.sync = cfg.policy == "sync"
        self.keep_decisions = keep_decisions
        self.now = 0.0
        self.vclock = 0.0  # virtual decoding clock: tokens decoded by every generating sequence
        self.version = 0  # learner version (the engine's follows after weight_copy_s and weight_sync_s)
        self.paused = False
        self.gen: list[tuple[float, int, int]] = []  # (virtual finish, seq, slot) of decoding sequences
        self.events: list[tuple[float, int, str, int]] = []  # (time, seq, kind, slot)
        self.seq = 0
        self.episodes: dict[int, _Episode] = {}
        self.requeue: deque[str] = deque()
        self.next_task = 0
        self.completed = 0
        self.training = False
        self.train_left = 0.0  # seconds of the current step still to run, at the learner's own speed
        self.settling = False  # after a step: weight sync and step_overhead_s still to pass
        self.copying = False  # after a step: the learner copies the weights for the engine (weight_copy_s)
        self.engine_version = 0  # the version whose weights the engine samples
        self.idle: list[int] = []  # slots held back by max_pool_size
        self.batches = 0
        self.durations: list[float] = []
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
        """Tokens/s of each decoding sequence now (0 when none decodes or the engine is paused)."""
        n = len(self.gen)
        if n == 0 or self.paused:
            return 0.0
        cfg = self.cfg
        step = (cfg.decode_base_s + cfg.decode_per_seq_s * n) * (cfg.train_slows_decode if self.training else 1.0)
        return 1.0 / step

    def train_speed(self, decoding: bool) -> float:
        """The learner's progress per second (1 alone; slower beside a decoding engine)."""
        return 1.0 / self.cfg.decode_slows_train if decoding else 1.0

    def start_episode(self, slot: int) -> None:
        cfg, rng = self.cfg, self.rng
        if self.requeue:
            task = self.requeue.popleft()
        else:
            task, self.next_task = f"task-{self.next_task}", self.next_task + 1
        if self.sample is not None:
            turns = self.sample.draw(rng)
        else:
            mu = math.log(cfg.tokens_mean) - cfg.tokens_sigma**2 / 2
            drawn = rng.lognormal(mu, cfg.tokens_sigma) if cfg.tokens_sigma else cfg.tokens_mean
            total = int(min(cfg.tokens_max, max(1.0, drawn)))
            turns = even_split(total, 1 + int(rng.poisson(cfg.turns_mean - 1)))
        sens = float(rng.lognormal(0.0, cfg.drift_noise_sigma)) if cfg.drift_noise_sigma else 1.0
        self.episodes[slot] = _Episode(task, turns, self.version, self.now, sens)
        self.start_turn(slot)

    def start_turn(self, slot: int) -> None:
        ep = self.episodes[slot]
        ep.pieces.append([])
        ep.version = ep.prefix_version = self.engine_version  # prefix recomputed under the engine's weights
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
            ep.version = self.engine_version  # prefix_version stays: the KV cache survived

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
        self.durations.append(self.now - ep.start_time)
        if self.sync:
            if self.sync_started < cfg.batch_size:
                self.sync_started += 1
                self.start_episode(slot)
        elif not self.room():
            self.idle.append(slot)
        else:
            self.start_episode(slot)

    def room(self) -> bool:
        """Whether back-pressure lets one more episode start: waiting plus playing below ``max_pool_size``."""
        cap = self.cfg.max_pool_size
        return cap is None or len(self.pool) + len(self.episodes) < cap

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
        """Select the next batch when the learner is free and B trajectories wait; start its step."""
        cfg = self.cfg
        while not self.training and not self.settling and len(self.pool) >= cfg.batch_size:
            if cfg.max_batches is not None and self.batches >= cfg.max_batches:
                return
            self.occ.append(len(self.pool))
            self.occ_series.append((self.now, len(self.pool)))
            sel = self.pool.select_batch(cfg.batch_size, self.version, self.scorer)
            d = sel.decision
            if self.keep_decisions:
                self.decisions.append(d.to_dict())
            self.rejected += len(sel.rejected)
            self.requeue.extend(sel.requeue_task_ids)
            self.restart_idle()
            if not sel.batch:
                return
            self.consumed += len(sel.batch)
            self.batches += 1
            self.gs.append(d.sel["gs"])
            self.ws.append(d.sel["ws"])
            if cfg.no_step_share and self.rng.random() < cfg.no_step_share:
                self.after_batch()  # no gradient: no step, no version; the next batch at once
                continue
            self.training = True
            self.train_left = cfg.train_step_s

    def restart_idle(self) -> None:
        """Slots held back by back-pressure start again, one by one while there is room (:meth:`room`)."""
        while self.idle and self.room():
            self.start_episode(self.idle.pop(0))

    # -- main loop --------------------------------------------------------------------------------
    def run(self) -> SimResult:
        cfg = self.cfg
        first = min(cfg.concurrency, cfg.batch_size) if self.sync else cfg.concurrency
        for slot in range(first):
            if self.sync or self.room():
                self.start_episode(slot)
            else:
                self.idle.append(slot)
        self.sync_started = first
        while self.completed < cfg.num_trajectories and not self.batches_done():
            r = self.rate()
            speed = self.train_speed(r > 0)
            t_gen = self.now + (self.gen[0][0] - self.vclock) / r if r > 0 else math.inf
            t_step = self.now + self.train_left / speed if self.training else math.inf
            t_evt = self.events[0][0] if self.events else math.inf
            t = min(t_gen, t_step, t_evt)
            if t == math.inf:
                raise RuntimeError("simulator stalled: nothing in flight and nothing scheduled")
            dt = t - self.now
            if r > 0:
                self.vclock += r * dt
                self.t_gen_busy += dt
                self.tok_area += r * len(self.gen) * dt
            if self.training:
                self.t_train += dt
                self.train_left = max(0.0, self.train_left - speed * dt)
            self.occ_area += len(self.pool) * dt
            self.now = t
            if t_gen <= min(t_step, t_evt):
                _, _, slot = heapq.heappop(self.gen)
                self.finish_turn(slot)
                self.try_train()
                continue
            if t_step <= t_evt:
                if not self.copying:  # the step is done: the learner's version moves on
                    self.version += 1
                    if cfg.weight_copy_s > 0:  # the engine keeps sampling the old weights meanwhile
                        self.copying, self.train_left = True, cfg.weight_copy_s
                        continue
                self.copying = self.training = False
                self.engine_version = self.version
                self.split_inflight()
                self.settling = True  # the learner is not free until the weights are in and the checks done
                if cfg.weight_sync_s > 0:  # nothing decodes until the new weights are loaded
                    self.paused = True
                    self.push(self.now + cfg.weight_sync_s, "sync_done")
                else:
                    self.push(self.now + cfg.step_overhead_s, "settled")
                continue
            _, _, kind, slot = heapq.heappop(self.events)
            if kind == "tool":
                self.start_turn(slot)
            elif kind == "sync_done":
                self.paused = False
                self.push(self.now + cfg.step_overhead_s, "settled")
            elif kind == "settled":
                self.settling = False
                self.after_batch()
        T = max(self.now, 1e-12)
        return SimResult(
            policy=cfg.policy, sim_time_s=self.now, updates=self.version, completed=self.completed,
            consumed=self.consumed, rejected=self.rejected,
            gs=np.concatenate(self.gs) if self.gs else np.zeros(0),
            ws=np.concatenate(self.ws) if self.ws else np.zeros(0),
            occupancy_at_select=np.asarray(self.occ, dtype=np.float64), occupancy_series=self.occ_series,
            occupancy_time_mean=self.occ_area / T, generator_busy=self.t_gen_busy / T,
            tokens_per_s=self.tok_area / T, trainer_busy=self.t_train / T,
            tokens_generated=self.tokens, episode_s=np.asarray(self.durations), batches=self.batches,
            decisions=self.decisions,
        )

    def batches_done(self) -> bool:
        """``max_batches`` consumed and the learner done with the last (its weights in the engine)."""
        m = self.cfg.max_batches
        return m is not None and self.batches >= m and not self.training and not self.settling

    def after_batch(self) -> None:
        """The learner is done with a batch (stepped or not): sync starts the next one; selection resumes."""
        if self.sync:  # next synchronous batch: generate B fresh episodes under the new version
            start = min(self.cfg.concurrency, self.cfg.batch_size)
            free = [s for s in range(self.cfg.concurrency) if s not in self.episodes][:start]
            for slot in free:
                self.start_episode(slot)
            self.sync_started = len(free)
            return
        self.try_train()


def simulate(cfg: SimConfig, keep_decisions: bool = False, episodes: EpisodeSample | None = None) -> SimResult:
    """Run one simulated pipeline until ``cfg.num_trajectories`` episodes have completed.

    Args:
        cfg: Settings; ``cfg.policy`` must not be ``"all"`` (use :func:`compare`).
        keep_decisions: Keep every pool decision record (memory grows with the run).
        episodes: Measured episode lengths to draw from instead of ``tokens_*`` and ``turns_mean``.

    Returns:
        The measured :class:`SimResult`.

    Raises:
        ConfigError: ``cfg.policy == "all"``.
    """
    if cfg.policy == "all":
        raise ConfigError("simulate() runs one policy; use compare() for 'all'")
    return _Sim(cfg, keep_decisions, episodes).run()


def compare(cfg: SimConfig, policies: tuple[str, ...] = SIM_POLICIES) -> list[SimResult]:
    """Run :func:`simulate` once per policy with otherwise identical settings and seed."""
    return [simulate(replace(cfg, policy=p)) for p in policies]


def main(argv: list[str] | None = None) -> int:
    """``agentenv simulate``: run the simulator and print its figures (a table for ``--policy all``).

    Args:
        argv: Command-line arguments (``sys.argv[1:]`` when None); one flag per :class:`SimConfig` field,
            or ``--from-run RUN...`` (:mod:`agentenv.trainer.experiments.sim_calibration`).

    Returns:
        0 on success (and for ``--help``), 2 on a bad flag or configuration value (message on stderr).
    """
    from agentenv.cli_args import parse

    argv = sys.argv[1:] if argv is None else argv
    if "--from-run" in argv:  # replay real runs, calibrated on two of them
        from agentenv.trainer.experiments.sim_calibration import main as from_run_main

        return from_run_main(argv)
    try:
        cfg = parse(SimConfig, argv, prog="agentenv simulate", conventions=False,
                    description="Simulate the asynchronous RL pipeline. "
                    "(--from-run RUN... replays real training runs instead: --from-run --help.)")
    except ConfigError as e:
        print(f"agentenv simulate: {e}", file=sys.stderr)
        return 2
    if isinstance(cfg, int):
        return cfg
    results = compare(cfg) if cfg.policy == "all" else [simulate(cfg)]
    print(format_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
