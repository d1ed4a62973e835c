"""Supervised warm-up: a few steps on scripted demonstrations the environment writes.

A small instruct model (the embedded SmolLM2-135M default) may never produce the tool calls or
answer format an environment needs, so reinforcement learning would see no successful rollout to
reinforce. An environment that can script its own episodes says so by overriding
:meth:`agentenv.core.Env.scripted_demonstrations` (``python_tool`` does:
``envs/python_tool/demonstrations.py``); :func:`sft_warmup` then takes a few supervised steps on
those transcripts. This module knows no environment.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from agentenv.errors import ConfigError, Interrupted
from agentenv.trainer.batching import build_batch
from agentenv.trainer.learners.forward import token_logprobs
from agentenv.trajectory import Trajectory

WARMUP_SEED = 0
"""Seeds the warm-up's demonstrations and batch order (the same for every run seed)."""
WARMUP_EXAMPLES = 320
"""Distinct demonstrations the environment writes for the warm-up (cycled through)."""


@dataclass(frozen=True)
class WarmupConfig:
    """Supervised warm-up on the environment's scripted demonstrations.

    Attributes:
        steps: Optimizer steps (0 disables the warm-up).
        batch_size: Transcripts per step.
        lr: AdamW learning rate.

    The environment writes :data:`WARMUP_EXAMPLES` distinct demonstrations, cycled through.

    The demonstrations and the batch order are drawn with the fixed seed :data:`WARMUP_SEED`, whatever
    ``run.seed`` is: the warm-up is one cached computation that every seed of a configuration shares,
    and so does the held-out evaluation before training.
    """

    MOVED_FIELDS: ClassVar[dict[str, str]] = {
        "seed": "the fixed WARMUP_SEED (0): every run seed shares one cached warm-up"}
    FIXED_FIELDS: ClassVar[dict[str, tuple[object, str]]] = {
        "num_examples": (WARMUP_EXAMPLES, "the demonstrations the environment writes, WARMUP_EXAMPLES")}

    steps: int = 40
    batch_size: int = 8
    lr: float = 5e-5

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1:
            raise ConfigError("warmup.steps must be >= 0 and warmup.batch_size >= 1")
        if self.lr <= 0:
            raise ConfigError(f"warmup.lr must be > 0, got {self.lr}")


def sft_warmup(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    cfg: WarmupConfig,
    *,
    log: Callable[[int, float], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> list[float]:
    """Run ``cfg.steps`` supervised steps (token-mean NLL over masked tokens) on ``examples``.

    Args:
        model: A causal LM returning ``logits`` ``(b, L, vocab)``; trained in place.
        examples: ``(ids, mask)`` pairs (:meth:`agentenv.core.Env.scripted_demonstrations`).
        cfg: Steps, batch size, learning rate.
        log: Called as ``log(step, loss)`` after each step.
        should_stop: Checked before each step (e.g. Ctrl-C seen by another thread).

    Returns:
        The loss of every step (nats per assistant token).

    Raises:
        Interrupted: ``should_stop()`` returned true; the model is left part-trained.
    """
    rng = random.Random(WARMUP_SEED)
    order = list(range(len(examples)))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    losses = []
    pos = len(order)
    for step in range(cfg.steps):
        if should_stop is not None and should_stop():
            raise Interrupted(f"stopped during the tool-use warm-up after {step} of {cfg.steps} steps (nothing cached)")
        batch = []
        for _ in range(cfg.batch_size):
            if pos >= len(order):
                rng.shuffle(order)
                pos = 0
            batch.append(examples[order[pos]])
            pos += 1
        # the whole batch in one pass: the system prompt and tool schemas every transcript starts
        # with run once (token_logprobs' shared prefix); the loss is the token-mean NLL over the batch
        policy = build_batch([_as_trajectory(x, m) for x, m in batch], pad_token_id=0)
        opt.zero_grad(set_to_none=True)
        lp, _ = token_logprobs(model, policy, share_prefix=True)
        total = int(policy.loss_mask.sum())
        loss = -lp[policy.loss_mask].sum() / total
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if log:
            log(step, losses[-1])
    model.eval()
    return losses


def _as_trajectory(ids: Sequence[int], mask: Sequence[int]) -> Trajectory:
    """A transcript as a trajectory: masked tokens are the policy's (log mu unused here, set to 0)."""
    tr = Trajectory(id="warmup")
    j = 0
    while j < len(ids):
        k = j
        while k < len(ids) and bool(mask[k]) == bool(mask[j]):
            k += 1
        run = list(ids[j:k])
        if mask[j]:
            tr.append_policy_tokens(run, [0.0] * len(run), 0, 0)
        else:
            tr.append_environment_tokens(run)
        j = k
    return tr
