"""The trajectory record: token ids, loss mask, behaviour log-probabilities and per-segment versions.

A trajectory is one episode kept as token ids from the first prompt token to the last (token in,
token out). Policy tokens (sampled by the model) carry the sampler's behaviour log-probability and
the policy version that sampled them; environment tokens (prompt, observations, template glue)
carry a loss-mask 0. A *segment* is a maximal run of policy tokens sampled under one policy version
with one prefix version (AReaL records a version per token; we keep the run-length form).

Staleness (docs/algorithms.md, "Staleness"), for policy tokens t = 1..T sampled under v_t,
completion version v_c and consumption version v_now:

* generation staleness  GS = (1/T) sum_t (v_c - v_t)
* waiting staleness     WS = v_now - v_c
* token-averaged staleness S = GS + WS
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field
from typing import Any

from agentenv.errors import DataError


@dataclass(frozen=True)
class Segment:
    """A maximal run of policy tokens sampled under one policy version.

    Attributes:
        start: Index of the segment's first token in :attr:`Trajectory.token_ids`.
        end: One past its last token (so ``end - start`` tokens).
        version: Policy version whose weights sampled these tokens.
        prefix_version: Oldest policy version that computed the KV cache the segment continued from;
            below ``version`` when the cache survived a weight update, equal when it was recomputed.
    """

    start: int
    end: int
    version: int
    prefix_version: int

    @property
    def num_tokens(self) -> int:
        """Number of tokens in the segment."""
        return self.end - self.start


@dataclass
class Trajectory:
    """One episode as token ids, with everything the pool and the learner need.

    All per-token lists have the same length ``L`` (tokens from the first prompt token on).

    Attributes:
        token_ids: ``(L,)`` token ids exactly as the engine conditioned on and produced them.
        loss_mask: ``(L,)`` 1 for policy tokens, 0 for prompt, observation and template tokens.
        behaviour_logprobs: ``(L,)`` the sampler's log-probability (nats, <= 0) of each policy token;
            0.0 at environment positions.
        segments: Policy-token segments in order, see :class:`Segment`.
        prompt_length: Tokens in the first prompt (before the first policy token).
        reward: Episode return (sum of step rewards).
        task_id: Which task (problem, game) the episode played; used to requeue rejected prompts.
        start_version: Learner version when the episode started.
        completion_version: Learner version when the episode completed and entered the pool.
        start_time / completion_time / consumption_time: ``time.time()`` seconds.
        status: ``"completed"`` (terminated or truncated by the env or a budget) or ``"error"``.
        info: Environment and loop diagnostics (turns, tool calls, truncation reason, error text).
    """

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    prompt_length: int = 0
    reward: float = 0.0
    task_id: str = ""
    start_version: int = 0
    completion_version: int = 0
    start_time: float = 0.0
    completion_time: float = 0.0
    consumption_time: float | None = None
    status: str = "completed"
    info: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: uuid.uuid4().hex)

    # -- building -------------------------------------------------------------------------------
    def append_environment_tokens(self, ids: list[int]) -> None:
        """Append prompt, observation or template tokens (no gradient)."""
        self.token_ids.extend(ids)
        self.loss_mask.extend([0] * len(ids))
        self.behaviour_logprobs.extend([0.0] * len(ids))

    def append_policy_tokens(
        self, ids: list[int], logprobs: list[float], version: int, prefix_version: int
    ) -> None:
        """Append tokens sampled under ``version`` and extend or open a segment.

        Consecutive calls with the same ``(version, prefix_version)`` that are adjacent in the
        token sequence merge into one segment.

        Raises:
            DataError: ``ids`` and ``logprobs`` differ in length, or a log-probability is positive
                or not finite.
        """
        if len(ids) != len(logprobs):
            raise DataError(f"{len(ids)} token ids but {len(logprobs)} log-probabilities")
        for lp in logprobs:
            if not math.isfinite(lp) or lp > 1e-6:
                raise DataError(f"trajectory {self.id}: invalid behaviour log-probability {lp!r}")
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        self.loss_mask.extend([1] * len(ids))
        self.behaviour_logprobs.extend(logprobs)
        last = self.segments[-1] if self.segments else None
        if last and last.end == start and last.version == version and last.prefix_version == prefix_version:
            self.segments[-1] = Segment(last.start, start + len(ids), version, prefix_version)
        else:
            self.segments.append(Segment(start, start + len(ids), version, prefix_version))

    # -- reading --------------------------------------------------------------------------------
    @property
    def num_policy_tokens(self) -> int:
        """T, the number of policy tokens (the FlashREINFORCE per-row denominator)."""
        return sum(s.num_tokens for s in self.segments)

    @property
    def generated_ids(self) -> list[int]:
        """Token ids after the first prompt (policy and observation tokens)."""
        return self.token_ids[self.prompt_length :]

    def token_versions(self) -> list[int]:
        """``(T,)`` the sampling version of each policy token, in order."""
        return [s.version for s in self.segments for _ in range(s.num_tokens)]

    def generation_staleness(self) -> float:
        """GS = (1/T) sum_k n_k (v_c - v_k), in policy versions; 0.0 for a trajectory with no policy token."""
        t = self.num_policy_tokens
        if t == 0:
            return 0.0
        return sum(s.num_tokens * (self.completion_version - s.version) for s in self.segments) / t

    def waiting_staleness(self, current_version: int) -> int:
        """WS = v_now - v_c, in policy versions."""
        return current_version - self.completion_version

    def staleness(self, current_version: int) -> float:
        """Token-averaged staleness S = GS + WS = (1/T) sum_t (v_now - v_t), in policy versions."""
        return self.generation_staleness() + self.waiting_staleness(current_version)

    def older_segment_token_share(self) -> float:
        """Share of policy tokens in segments older than the newest one (0.0 when unsplit)."""
        t = self.num_policy_tokens
        if t == 0:
            return 0.0
        newest = max(s.version for s in self.segments)
        return sum(s.num_tokens for s in self.segments if s.version < newest) / t

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (segments as lists ``[start, end, version, prefix_version]``)."""
        d = {k: v for k, v in self.__dict__.items() if k != "segments"}
        d["segments"] = [[s.start, s.end, s.version, s.prefix_version] for s in self.segments]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        segs = [Segment(*s) for s in d.pop("segments", [])]
        return cls(segments=segs, **d)
