"""The trajectory pool: completed trajectories wait here and the learner takes batches from it.

The pool owns the staleness policy (:class:`~agentenv.rollout.staleness.StalenessConfig`): ``none``
(unfiltered asynchronous), ``max_lag`` (a fixed cap), ``pace`` (PACE's adaptive budget on effective
staleness, docs/algorithms.md, "PACE") and ``sync`` (selected like ``none``; the loop runs no
overlap). Per-trajectory summaries (completion version, GS, older-token share, oldest version) are
kept as numpy columns when a trajectory is added, so a decision over 10,000 candidates is a few
vectorised passes rather than a walk over every segment.

Semantics of :meth:`TrajectoryPool.select_batch` (``B`` = batch size, ``N`` = occupancy):

* ``N < B``: nothing happens (no rejection, the smoothed rate is untouched) except under ``max_lag``,
  which still rejects over-cap candidates; the batch is empty and the learner waits.
* ``pace`` with ``N >= B``: the rate ``r`` is updated exactly once, then ``k`` candidates are
  rejected (never cutting the pool below ``max(N_target, B)``), so a batch is always formed and ``r``
  updates once per optimizer step.
* The batch is the ``B`` oldest remaining trajectories, in completion (= :meth:`add`) order.
* Definitions (see :mod:`agentenv.rollout.staleness`): ``u_i`` = average 1-based rank of ``f_i`` / ``n``
  (ties share their mean rank); among equal ``S_eff`` the later-completed candidate is rejected
  first; a trajectory whose policy tokens all share one version has ``f_i = 0`` and is not scored
  for ``f`` (only if it lands in the batch, to return its scores); ``pace`` with
  ``drift_mode="token_share"`` uses ``w_i`` = the token share of segments older than the newest.
* ``pace`` scoring with a zero budget scores only the batch (nothing to rank); its ``w``/``S_eff``
  are then not computed (``None`` in the log).

Groups (GRPO): a pool built with ``group_size=n > 1`` holds whole groups of ``n`` rollouts of one task,
added together by :meth:`TrajectoryPool.add_group` and kept contiguous (group ``g`` is rows
``[g n, (g+1) n)``). Every policy acts on whole groups: a group is rejected or kept as a unit, and the
batch is ``B / n`` whole groups (``B`` must be a multiple of ``n``). Per-row quantities (``GS``,
``WS``, ``f`` and its percentile rank over all rows, ``w``, ``S_eff``) are computed as above; a group's
score is that of its stalest member (the maximum ``S_eff``, or, under ``max_lag``, the maximum
measured lag: a group is rejected when any member is over the cap). PACE counts its budget in
groups: ``e`` is the row excess (equal to the group excess with ``N_target / n``), ``k = round(r G)``
groups with ``G = N / n``, capped so that at least ``ceil(max(N_target, B) / n)`` groups remain. The
decision record's ``budget`` and ``rejected_count`` are in rows (``k n``). With ``n = 1`` all of this
is the per-trajectory behaviour above.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentenv.errors import ConfigError, DataError
from agentenv.rollout.staleness import (
    StalenessConfig,
    effective_staleness,
    excess,
    highest_first,
    pace_weights,
    rejection_budget,
    update_rate,
)
from agentenv.trajectory import Trajectory

DriftScorer = Callable[[Sequence[Trajectory]], Sequence[Any]]
"""``scorer(trajectories) -> [logprobs_i]``: the current learner's log-probabilities ``(T_i,)`` of each
trajectory's policy tokens, in order (tensor or array; nats, <= 0)."""

_COLUMNS = {
    "seq": np.int64, "v_c": np.int64, "gs": np.float64, "share": np.float64, "v_min": np.int64,
    "t": np.int64,  # policy tokens T
    "n_old": np.int64,  # tokens in segments older than the newest
    "f": np.float64,  # prefix drift, valid where f_ver == the current version
    "f_ver": np.int64,
}
_NEVER = np.iinfo(np.int64).min


@dataclass(frozen=True)
class _Older:
    """Policy-token positions of a trajectory's older segments and their behaviour log-probs."""

    n: int  # number of older-segment tokens
    idx: np.ndarray | None  # (n,) int64 indices into the (T,) policy tokens; None when they are [0, n)
    mu: np.ndarray  # (n,) float64 behaviour log-probabilities there


def _older_tokens(traj: Trajectory) -> _Older:
    segs = traj.segments
    newest = max(s.version for s in segs) if segs else 0
    idx, mu, pos = [], [], 0
    for s in segs:
        if s.version < newest:
            idx.append(np.arange(pos, pos + s.num_tokens, dtype=np.int64))
            mu.append(np.asarray(traj.behaviour_logprobs[s.start : s.end], dtype=np.float64))
        pos += s.num_tokens
    if not idx:
        return _Older(0, None, np.zeros(0))
    i = np.concatenate(idx)
    prefix = bool(i[-1] == i.shape[0] - 1)  # versions never decrease: the older tokens come first
    return _Older(i.shape[0], None if prefix else i, np.concatenate(mu))


def _check_logprobs(q: np.ndarray) -> None:
    if not np.isfinite(q).all() or (q > 1e-6).any():
        raise DataError("drift_scorer: non-finite or positive log-probability")


@dataclass
class SelectionDecision:
    """One step's pool decision, logged as one JSONL record (:meth:`to_dict`).

    Per-candidate arrays cover the selected (``sel_*``, batch order) and rejected (``rej_*``, rejection
    order) candidates only; all staleness values in policy versions. ``f`` is NaN (``None`` in the
    record) where no drift was computed, ``w`` and ``s_eff`` NaN where not used by the policy. Under
    ``none``/``max_lag`` ``w`` is 1 and ``s_eff`` is the quantity compared with the cap (the oldest
    token's lag).
    """

    step: int
    policy: str
    drift_mode: str
    current_version: int
    occupancy: int
    target: int
    batch_size: int
    excess: float = 0.0
    rate: float = 0.0
    budget: int = 0
    rejected_count: int = 0
    waited: bool = False
    mean_gs: float = 0.0
    mean_ws: float = 0.0
    sel_ids: list[str] = field(default_factory=list)
    sel_task_ids: list[str] = field(default_factory=list)
    sel: dict[str, np.ndarray] = field(default_factory=dict)
    rej_ids: list[str] = field(default_factory=list)
    rej_task_ids: list[str] = field(default_factory=list)
    rej: dict[str, np.ndarray] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable record: scalars plus ``selected``/``rejected`` lists of per-candidate dicts."""

        def rows(ids: list[str], tasks: list[str], cols: dict[str, np.ndarray]) -> list[dict[str, Any]]:
            out = []
            for j, (i, t) in enumerate(zip(ids, tasks, strict=True)):
                row: dict[str, Any] = {"id": i, "task_id": t}
                for name in ("gs", "ws", "s_eff", "f", "w"):
                    v = float(cols[name][j])
                    row[name] = None if math.isnan(v) else v
                out.append(row)
            return out

        d = {k: getattr(self, k) for k in (
            "step", "policy", "drift_mode", "current_version", "occupancy", "target", "batch_size",
            "excess", "rate", "budget", "rejected_count", "waited", "mean_gs", "mean_ws")}
        d["selected"] = rows(self.sel_ids, self.sel_task_ids, self.sel)
        d["rejected"] = rows(self.rej_ids, self.rej_task_ids, self.rej)
        return d


@dataclass
class BatchSelection:
    """What :meth:`TrajectoryPool.select_batch` returns.

    Attributes:
        batch: ``B`` trajectories in completion order, or ``[]`` when the learner must wait.
        rejected: Trajectories removed from the pool by the policy at this call.
        decision: The logged decision record.
        scores: ``pace`` scoring mode only: the scoring pass's ``(T_i,)`` current log-probabilities for
            each batch member (aligned with ``batch``), for the FlashREINFORCE gate's ``q``; else None.
        requeue_task_ids: Task ids of ``rejected``, to be played again.
    """

    batch: list[Trajectory]
    rejected: list[Trajectory]
    decision: SelectionDecision
    scores: list[np.ndarray] | None = None
    requeue_task_ids: list[str] = field(default_factory=list)


#: Version of :meth:`TrajectoryPool.state_dict`'s layout; a checkpoint of another format is refused.
POOL_STATE_FORMAT = 1


class TrajectoryPool:
    """Completed trajectories in completion order, and the staleness policy that draws batches.

    Args:
        config: The staleness policy and its hyper-parameters.
        group_size: ``n``, rollouts per task that form one GRPO group (1: every trajectory is its own
            group). With ``n > 1`` trajectories enter only through :meth:`add_group`.

    Raises:
        ConfigError: ``group_size`` is not an int >= 1.
    """

    def __init__(self, config: StalenessConfig | None = None, *, group_size: int = 1) -> None:
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ConfigError(f"group_size must be an int >= 1, got {group_size!r}")
        self.config = config or StalenessConfig()
        self.group_size = group_size
        """``n``: rows per group (rollouts of one task), 1 without groups."""
        self._trajs: list[Trajectory] = []
        self._ids: set[str] = set()
        self._older: list[_Older] = []  # pace scoring mode only (else stays empty)
        self._cols = {k: np.zeros(64, dtype=t) for k, t in _COLUMNS.items()}
        self._next_seq = 0
        self._step = 0
        self.rate = 0.0
        """The smoothed rejection rate ``r`` (dimensionless, in [0, 1])."""
        self._score_version: int | None = None
        self._score_cache: dict[str, np.ndarray] = {}

    # -- contents ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._trajs)

    @property
    def trajectories(self) -> list[Trajectory]:
        """A copy of the pooled trajectories, oldest first."""
        return list(self._trajs)

    def add(self, traj: Trajectory) -> None:
        """Add a completed trajectory; call in completion order (it sets the pool's order).

        Raises:
            DataError: ``traj`` is not a :class:`Trajectory`, has no policy token, is already pooled,
                has a segment past its token lists, or a segment version above its completion version.
            ConfigError: The pool holds groups of ``group_size > 1`` (use :meth:`add_group`).
        """
        if self.group_size != 1:
            raise ConfigError(f"this pool holds groups of {self.group_size}; add them with add_group")
        self.add_group([traj])

    def add_group(self, trajs: Sequence[Trajectory]) -> None:
        """Add one group: ``group_size`` completed rollouts of one task, kept together in this order.

        All members are checked before any is added, so a bad group leaves the pool unchanged.

        Raises:
            DataError: Not exactly ``group_size`` trajectories, members of different tasks
                (``task_id``), or a member that :meth:`add` would refuse (not a :class:`Trajectory`,
                no policy token, already pooled or twice in the group, a segment past its token
                lists, a segment version above its completion version).
        """
        trajs = list(trajs)
        if len(trajs) != self.group_size:
            raise DataError(f"a group has {self.group_size} trajectories, got {len(trajs)}")
        for traj in trajs:
            self._check(traj)
        if len({t.id for t in trajs}) != len(trajs):
            raise DataError("a trajectory appears twice in one group")
        if len({t.task_id for t in trajs}) != 1:
            raise DataError(f"a group's rollouts must play one task, got task ids {sorted({t.task_id for t in trajs})}")
        for traj in trajs:
            self._append(traj)

    def _check(self, traj: Trajectory) -> None:
        if not isinstance(traj, Trajectory):
            raise DataError(f"pool.add expects a Trajectory, got {type(traj).__name__}")
        if traj.num_policy_tokens == 0:
            raise DataError(f"trajectory {traj.id} has no policy token; nothing to learn from")
        if traj.id in self._ids:
            raise DataError(f"trajectory {traj.id} is already in the pool")
        if max(s.end for s in traj.segments) > min(len(traj.token_ids), len(traj.behaviour_logprobs)):
            raise DataError(f"trajectory {traj.id}: a segment ends past its token lists")
        if max(s.version for s in traj.segments) > traj.completion_version:
            raise DataError(f"trajectory {traj.id}: a segment's version is above completion_version "
                            f"{traj.completion_version}")

    def _append(self, traj: Trajectory) -> None:
        n = len(self._trajs)
        if n == self._cols["seq"].shape[0]:
            self._cols = {k: np.concatenate([c, np.zeros_like(c)]) for k, c in self._cols.items()}
        c = self._cols
        c["seq"][n] = self._next_seq
        c["v_c"][n] = traj.completion_version
        c["gs"][n] = traj.generation_staleness()
        c["share"][n] = traj.older_segment_token_share()
        c["v_min"][n] = min(s.version for s in traj.segments)
        newest = max(s.version for s in traj.segments)
        c["t"][n] = traj.num_policy_tokens
        c["n_old"][n] = sum(s.num_tokens for s in traj.segments if s.version < newest)
        c["f"][n], c["f_ver"][n] = 0.0, _NEVER
        self._next_seq += 1
        self._trajs.append(traj)
        self._ids.add(traj.id)
        scoring = self.config.policy == "pace" and self.config.drift_mode == "scoring"
        if scoring:
            self._older.append(_older_tokens(traj))

    def _remove(self, keep: np.ndarray, removed_ids: list[str]) -> None:
        n = len(self._trajs)
        m = int(keep.sum())
        for c in self._cols.values():
            c[:m] = c[:n][keep]
        self._ids.difference_update(removed_ids)
        flags = keep.tolist()
        self._trajs = list(itertools.compress(self._trajs, flags))
        if self._older:
            self._older = list(itertools.compress(self._older, flags))

    def copy(self) -> TrajectoryPool:
        """An independent pool with the same contents, rate and caches (trajectories shared, not copied)."""
        new = TrajectoryPool(self.config)
        new.__dict__.update(self.__dict__)
        new._cols = {k: v.copy() for k, v in self._cols.items()}
        new._trajs, new._older, new._ids = list(self._trajs), list(self._older), set(self._ids)
        new._score_cache = dict(self._score_cache)
        return new

    # -- selection --------------------------------------------------------------------------------
    def select_batch(
        self, batch_size: int, current_version: int, drift_scorer: DriftScorer | None = None
    ) -> BatchSelection:
        """Apply the staleness policy and take a batch (docs/algorithms.md, "Staleness policies").

        Args:
            batch_size: B, trajectories per optimizer step (>= 1; a multiple of ``group_size``).
            current_version: ``v_now``, the learner's policy version now.
            drift_scorer: ``pace`` with ``drift_mode="scoring"``: returns the current learner's
                ``(T_i,)`` policy-token log-probabilities for a list of trajectories. Called at most
                twice per call and never twice for one trajectory at one version: when the budget is
                positive, on the candidates with older segments (the others have ``f = 0``); then on
                the batch members still unscored, so ``scores`` covers the whole batch.

        The scorer's log-probabilities are checked (finite, <= 0) on the older-segment tokens used
        for ``f`` and on every batch member's array returned in ``scores``.

        Returns:
            The batch (``B`` oldest remaining, completion order, or empty; ``B / n`` whole groups,
            each contiguous), the rejected trajectories (whole groups, members together), the decision
            record and, in scoring mode, the batch's scores.

        Raises:
            ConfigError: ``batch_size < 1`` or not a multiple of ``group_size``, or scoring mode
                without a ``drift_scorer``.
            DataError: ``current_version`` is below a pooled completion version, or the scorer
                returned the wrong number or shape of arrays or a non-finite or positive
                log-probability; the pool is left unchanged.
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be an int >= 1, got {batch_size!r}")
        g = self.group_size
        if batch_size % g:
            raise ConfigError(f"batch_size {batch_size} is not a whole number of groups of {g}")
        cfg = self.config
        scoring = cfg.policy == "pace" and cfg.drift_mode == "scoring"
        if scoring and drift_scorer is None:
            raise ConfigError("staleness.drift_mode='scoring' needs a drift_scorer (or use 'token_share')")
        n = len(self._trajs)
        if n and int(self._cols["v_c"][:n].max()) > current_version:
            raise DataError(f"current_version {current_version} is below a pooled trajectory's "
                            f"completion_version {int(self._cols['v_c'][:n].max())}")
        self._sync_version(current_version)
        b = batch_size
        target = cfg.target_occupancy if cfg.target_occupancy is not None else b
        c = {k: v[:n] for k, v in self._cols.items()}
        gs = c["gs"]
        ws = (current_version - c["v_c"]).astype(np.float64)
        dec = SelectionDecision(
            step=self._step, policy=cfg.policy, drift_mode=cfg.drift_mode, current_version=current_version,
            occupancy=n, target=target, batch_size=b, rate=self.rate,
            mean_gs=float(gs.mean()) if n else 0.0, mean_ws=float(ws.mean()) if n else 0.0,
        )
        nan = np.full(n, np.nan)
        f, w, s_eff = nan, nan, nan
        reject = np.zeros(0, dtype=np.int64)
        scores: list[np.ndarray] | None = None
        new_rate = self.rate

        n_groups = n // g

        def rows_of(groups: np.ndarray) -> np.ndarray:  # group indices -> their rows, members together
            return (groups[:, None] * g + np.arange(g)).reshape(-1).astype(np.int64)

        if cfg.policy == "max_lag":
            lag = (current_version - c["v_min"]).astype(float)  # the oldest token's lag
            w, s_eff = np.ones(n), lag
            reject = rows_of(np.flatnonzero((lag > cfg.max_lag).reshape(n_groups, g).any(axis=1)))
        elif cfg.policy in ("none", "sync"):
            w, s_eff = np.ones(n), ws + gs
        elif n >= b:  # pace, enough candidates for a batch
            dec.excess = excess(n, target)
            new_rate = dec.rate = update_rate(self.rate, dec.excess, cfg.beta)
            k = rejection_budget(new_rate, n_groups, -(-max(target, b) // g))  # in groups
            dec.budget = k * g
            if cfg.drift_mode == "token_share":
                w = c["share"].copy()
                s_eff = effective_staleness(ws, gs, w)
                reject = rows_of(highest_first(s_eff.reshape(n_groups, g).max(axis=1), k))
            elif k > 0:
                f = self._drift(np.arange(n), drift_scorer, current_version, score_all=False)
                w = pace_weights(f, cfg.gamma)
                s_eff = effective_staleness(ws, gs, w)
                reject = rows_of(highest_first(s_eff.reshape(n_groups, g).max(axis=1), k))

        keep = np.ones(n, dtype=bool)
        keep[reject] = False
        remaining = np.flatnonzero(keep)
        chosen = remaining[:b] if remaining.shape[0] >= b else np.zeros(0, dtype=np.int64)
        dec.waited = chosen.shape[0] == 0
        if scoring and chosen.shape[0]:
            if (self._cols["f_ver"][chosen] != current_version).any():  # the learner's gate needs q
                self._drift(chosen, drift_scorer, current_version, score_all=True)
            if np.isnan(f[chosen]).any():  # budget 0: f was computed for the batch only (for the log)
                f = nan.copy()
                f[chosen] = self._cols["f"][chosen]
            scores = [self._score_cache[self._trajs[i].id] for i in chosen.tolist()]
            _check_logprobs(np.concatenate(scores))

        # Nothing below can fail: commit the decision.
        self.rate = new_rate
        batch = [self._trajs[i] for i in chosen.tolist()]
        rejected = [self._trajs[i] for i in reject.tolist()]
        cols = {"gs": gs, "ws": ws, "s_eff": s_eff, "f": f, "w": w}
        dec.sel = {k: v[chosen] for k, v in cols.items()}
        dec.rej = {k: v[reject] for k, v in cols.items()}
        dec.sel_ids, dec.sel_task_ids = [t.id for t in batch], [t.task_id for t in batch]
        dec.rej_ids, dec.rej_task_ids = [t.id for t in rejected], [t.task_id for t in rejected]
        dec.rejected_count = len(rejected)
        if chosen.shape[0] or reject.shape[0]:
            keep[chosen] = False
            self._remove(keep, dec.sel_ids + dec.rej_ids)
            self._step += 1
        return BatchSelection(batch, rejected, dec, scores, [t.task_id for t in rejected])

    def _sync_version(self, version: int) -> None:
        """Drop the scores and drifts of another version (``f`` is valid where ``f_ver == version``)."""
        if self._score_version != version:
            self._score_version, self._score_cache = version, {}
            self._cols["f_ver"][:] = _NEVER

    def _drift(self, rows: np.ndarray, scorer: DriftScorer, version: int, score_all: bool) -> np.ndarray:
        """Prefix drift ``f`` ``(len(rows),)`` for pool rows, scoring those not scored at ``version``.

        A single-version row has ``f = 0`` without a score; it is scored only when ``score_all`` (the
        batch, whose scores go back to the learner). The scorer's arrays are reduced in one vectorised
        block over their concatenation; ``f`` is kept in a column (valid while ``f_ver == version``)
        and the arrays in a per-version cache.
        """
        self._sync_version(version)
        c = {k: v[: len(self._trajs)] for k, v in self._cols.items()}
        need = (c["f_ver"][rows] != version) & (score_all | (c["n_old"][rows] > 0))
        todo = rows[need]
        if todo.size:
            trajs = [self._trajs[i] for i in todo.tolist()]
            out = scorer(trajs)
            if len(out) != len(trajs):
                raise DataError(f"drift_scorer returned {len(out)} arrays for {len(trajs)} trajectories")
            arrs = [
                (s.detach().cpu().double().numpy() if hasattr(s, "detach") else np.asarray(s)).reshape(-1)
                for s in out
            ]
            lens = np.fromiter((a.shape[0] for a in arrs), dtype=np.int64, count=len(arrs))
            want = c["t"][todo]
            if (bad := np.flatnonzero(lens != want)).size:
                raise DataError(f"drift_scorer: trajectory {trajs[bad[0]].id} has {want[bad[0]]} policy "
                                f"tokens, got {lens[bad[0]]} log-probabilities")
            nold = c["n_old"][todo]
            f_new = np.zeros(todo.shape[0])
            if nold.sum():
                olds = [self._older[i] for i in todo.tolist()]
                pairs = zip(arrs, olds, strict=True)
                parts = [a[: o.n] if o.idx is None else a[o.idx] for a, o in pairs if o.n]
                q = np.concatenate(parts)
                _check_logprobs(q)
                d = np.abs(q - np.concatenate([o.mu for o in olds if o.n]))
                has = nold > 0
                starts = (np.cumsum(nold) - nold)[has]
                f_new[has] = np.add.reduceat(d, starts, dtype=np.float64) / nold[has]
            c["f"][todo], c["f_ver"][todo] = f_new, version
            self._score_cache.update(zip((t.id for t in trajs), arrs, strict=True))
        return np.where(c["f_ver"][rows] == version, c["f"][rows], 0.0)

    # -- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable pool state: trajectories (oldest first), smoothed rate, step counter, group size."""
        return {"format": POOL_STATE_FORMAT, "trajectories": [t.to_dict() for t in self._trajs], "rate": self.rate,
                "step": self._step, "group_size": self.group_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the pool's contents with a :meth:`state_dict`.

        A state without ``group_size`` (written before groups existed) has groups of 1; one without
        ``format`` is format 1.

        Raises:
            DataError: The state is malformed (missing key, bad trajectory record, a group size other
                than this pool's, an incomplete group); the pool is unchanged.
        """
        fmt = state.get("format", 1) if isinstance(state, dict) else None
        if fmt != POOL_STATE_FORMAT:
            raise DataError(f"bad pool state: format {fmt!r}, this agentenv reads format {POOL_STATE_FORMAT}")
        try:
            trajs = [Trajectory.from_dict(d) for d in state["trajectories"]]
            rate, step = float(state["rate"]), int(state["step"])
            saved_group = int(state.get("group_size", 1))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise DataError(f"bad pool state: {e}") from e
        if not 0.0 <= rate <= 1.0:
            raise DataError(f"bad pool state: rate {rate} outside [0, 1]")
        g = self.group_size
        if saved_group != g or len(trajs) % g:
            raise DataError(f"bad pool state: {len(trajs)} trajectories in groups of {saved_group}, "
                            f"this pool holds groups of {g}")
        fresh = TrajectoryPool(self.config, group_size=g)
        for i in range(0, len(trajs), g):
            fresh.add_group(trajs[i : i + g])
        self.__dict__.update(fresh.__dict__)
        self.rate, self._step = rate, step


# -- rejection by length --------------------------------------------------------------------------
#: The length bins of :func:`rejection_by_length`, shortest first.
LENGTH_BINS = ("short", "medium", "long")


def length_bin(policy_tokens: int, budget: int) -> str:
    """The bin of a trajectory of ``T = policy_tokens`` policy tokens, in thirds of ``budget`` (tokens).

    ``short``: ``T <= budget / 3``; ``medium``: ``budget / 3 < T <= 2 budget / 3``; ``long``: above
    (``budget`` is :attr:`agentenv.rollout.episode.RolloutConfig.policy_token_budget`, the most a trajectory holds).

    Raises:
        ConfigError: ``budget < 1``.
    """
    if budget < 1:
        raise ConfigError(f"the policy-token budget must be >= 1 token, got {budget}")
    if 3 * policy_tokens <= budget:
        return "short"
    return "medium" if 3 * policy_tokens <= 2 * budget else "long"


def rejection_by_length(rejected: Sequence[Trajectory], consumed: Sequence[Trajectory],
                        budget: int) -> dict[str, float]:
    """Per length bin, how many of the trajectories that left the pool for one update were rejected.

    A trajectory leaves the pool either rejected by the staleness policy or consumed in the batch,
    so over a run ``rejected / (rejected + consumed)`` in a bin is the chance that a trajectory of
    that length was thrown away: a policy that starves long trajectories shows a higher rate in
    ``long`` than in ``short``.

    Args:
        rejected: The trajectories rejected while this update's batch was being selected (every
            selection attempt since the previous batch).
        consumed: The batch.
        budget: The policy-token budget per trajectory that sets the bins (:func:`length_bin`).

    Returns:
        For each bin of :data:`LENGTH_BINS`, ``pool/rejected_by_length/<bin>`` (trajectories) and
        ``pool/rejected_rate_by_length/<bin>`` = rejected / (rejected + consumed) in the bin, NaN
        when no trajectory of the bin left the pool.
    """
    counts = {name: [0, 0] for name in LENGTH_BINS}  # bin -> [rejected, consumed]
    for column, trajs in enumerate((rejected, consumed)):
        for traj in trajs:
            counts[length_bin(traj.num_policy_tokens, budget)][column] += 1
    out: dict[str, float] = {}
    for name, (rej, used) in counts.items():
        out[f"pool/rejected_by_length/{name}"] = float(rej)
        out[f"pool/rejected_rate_by_length/{name}"] = rej / (rej + used) if rej + used else math.nan
    return out
