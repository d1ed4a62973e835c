"""The sampling check: after every weight sync, the engine samples the policy version it claims.

A weight update that silently does nothing (an engine that kept its old weights, a stale adapter or
prefix cache) leaves a run sampling an older policy while every token is labelled with the new
version; the importance ratios and the gate then correct for a policy that was never used. After
each sync to version ``v`` the engine samples a fixed probe (the prompts of the first batch's first
:data:`PROBE_ROWS` rows, :data:`PROBE_TOKENS` tokens each, fixed seeds, the run's sampling transform),
and the learner, holding the weights of ``v``, scores the same tokens. At lag 0 the two
log-probabilities differ only by numerics, so the mean absolute gap

    gap = (1/N) sum_t |log pi_v(a_t) - log mu(a_t)|   (nats per token, over the probe's N tokens)

is logged per update (``sync/probe_logprob_gap``) and a gap above :func:`gap_bound` stops the run
with an error that names the version. Under ``staleness.forced_lag`` the engine serves older weights
on purpose, and the check is off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import replace

import torch

from agentenv.engines.base import GenerationEngine, SamplingParams
from agentenv.errors import AgentEnvError, EngineError
from agentenv.rollout.episode import append_output
from agentenv.trainer.config import TrainConfig
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trajectory import Trajectory

__all__ = ["PROBE_ROWS", "PROBE_TOKENS", "SamplingMismatch", "SyncCheck", "gap_bound", "sync_check"]

logger = logging.getLogger(__name__)

PROBE_ROWS = 4
"""Prompts in the probe (the first batch's first rows)."""
PROBE_TOKENS = 16
"""Tokens sampled per probe prompt."""
PROBE_SEED = 7_919
"""Seed of the probe's first request (the i-th uses ``PROBE_SEED + i``)."""
FLOAT32_BOUND = 1e-5
"""Largest gap (nats per token) accepted from a float32 engine and learner. Measured on the CPU default
(BENCHMARKS.md, "The sampling check"): 2e-9 at a correct sync, alone or sharing the engine's batches;
a sync that did not take shows 1.2e-6 after one update and 1.8e-5 after three, so a run whose syncs
stopped taking is stopped within a few updates."""
BFLOAT16_BOUND = 0.1
"""Largest gap (nats per token) accepted where the engine samples in 16-bit floats (vLLM, a GPU): their
rounding alone differs from the learner's by about 1e-2 per token, so only gross failures (an engine
that serves the base model or an adapter many updates old) cross it. Not measured on a GPU here."""


class SamplingMismatch(AgentEnvError):
    """The engine does not sample the policy version it claims (the weight sync did not take)."""


def gap_bound(cfg: TrainConfig) -> float:
    """The largest probe gap (nats per token) a correct sync shows.

    :data:`FLOAT32_BOUND` for a transformers engine on the CPU with a float32 learner (the policy loads
    in float32), :data:`BFLOAT16_BOUND` where either side computes in 16-bit floats (vLLM, a GPU, a
    DeepSpeed learner in bf16 or fp16).
    """
    float32 = cfg.model.engine == "transformers" and cfg.model.device == "cpu" and cfg.learner.param_dtype == "fp32"
    return FLOAT32_BOUND if float32 else BFLOAT16_BOUND


def sync_check(cfg: TrainConfig) -> SyncCheck | None:
    """The run's check (None under ``staleness.forced_lag``: the engine then serves older weights on purpose)."""
    if cfg.staleness.forced_lag:
        return None
    r = cfg.rollout
    params = SamplingParams(max_new_tokens=PROBE_TOKENS, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k)
    return SyncCheck(params, gap_bound(cfg))


class SyncCheck:
    """Samples the probe after a sync and compares the engine's log-probabilities with the learner's.

    Args:
        params: The probe's sampling settings (the run's transform, :data:`PROBE_TOKENS` tokens; the
            seed is set per prompt).
        bound: The largest gap accepted (nats per token).
    """

    def __init__(self, params: SamplingParams, bound: float) -> None:
        self.params = params
        self.bound = bound
        self.prompts: list[list[int]] = []

    def take_prompts(self, batch: Sequence[Trajectory]) -> None:
        """Keep the prompts (tokens before the first policy token) of ``batch``'s first rows, once."""
        if not self.prompts:
            self.prompts = [list(t.token_ids[: t.prompt_length]) for t in batch[:PROBE_ROWS] if t.prompt_length]

    async def after_sync(self, engine: GenerationEngine, learner: PolicyLearner, version: int) -> float | None:
        """The probe gap at ``version`` (nats per token); None before the probe has prompts.

        Call it after ``engine.update_weights(..., version)`` with the learner holding the weights of
        ``version`` (not stepping).

        Raises:
            SamplingMismatch: The engine labelled a probe token with another version, or the gap is above
                the bound.
        """
        gap = await self.probe_gap(engine, learner, version)
        if gap is not None and gap > self.bound:
            raise SamplingMismatch(
                f"the engine does not sample policy version {version}: on the probe its log-probabilities differ "
                f"from the learner's by {gap:.3g} nats per token (bound {self.bound:g}); the weight sync to version "
                f"{version} did not take (an engine that kept older weights, a stale adapter or prefix cache)")
        return gap

    async def probe_gap(self, engine: GenerationEngine, learner: PolicyLearner, version: int) -> float | None:
        """Mean ``|log pi - log mu|`` (nats per token) over the probe sampled now by ``engine``, scored by ``learner``.

        Returns None before the probe has prompts (or when no probe token was sampled).

        Raises:
            SamplingMismatch: The engine labelled a probe token with a version other than ``version``.
        """
        if not self.prompts:
            return None
        # The probe's prompts go to the engine together: they share its decode steps with each other
        # and with the episodes in flight (one after the other they cost four times the steps).
        # Each request carries its own seed, so the tokens do not depend on what shares the batch.
        outs = await asyncio.gather(*(engine.generate(prompt, replace(self.params, seed=PROBE_SEED + i))
                                      for i, prompt in enumerate(self.prompts)), return_exceptions=True)
        for out in outs:
            if isinstance(out, EngineError):  # a dying engine is the supervisor's business: no check this time
                logger.warning("sampling check at version %d skipped: %s", version, out)
                return None
            if isinstance(out, BaseException):
                raise out
        probe = []
        for prompt, out in zip(self.prompts, outs, strict=True):
            claimed = {s.version for s in out.spans}
            if claimed - {version}:
                raise SamplingMismatch(f"after the sync to policy version {version} the engine sampled the probe "
                                       f"under version(s) {sorted(claimed)}")
            traj = Trajectory(start_version=version, completion_version=version)
            traj.append_environment_tokens(prompt)
            traj.prompt_length = len(prompt)
            append_output(traj, out)
            if traj.num_policy_tokens:
                probe.append(traj)
        if not probe:
            return None
        scored = await asyncio.to_thread(learner.score, probe)
        behaviour = [torch.tensor([lp for lp, m in zip(t.behaviour_logprobs, t.loss_mask, strict=True) if m])
                     for t in probe]
        diffs = [(s.double() - b.double()).abs() for s, b in zip(scored, behaviour, strict=True)]
        return float(torch.cat(diffs).mean())
