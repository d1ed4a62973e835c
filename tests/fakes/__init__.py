"""Scripted stand-ins for the model side (engine, renderer) and a tiny deterministic env.

They let the agent loop, the collector and the training loop be tested exactly, without a model.
The renderer maps each character to its code point (ids 0..255) and uses id 1000 as end of turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import ClassVar

from agentenv.core import Env, StepResult
from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.errors import EngineError, ResetNeeded
from agentenv.rollout.episode import Renderer

EOT = 1000


class FakeClock:
    """A monotonic time source (seconds) that moves only when a test sets ``now``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def recording_learner(batches: list[list], build_learner=None):
    """A ``LoopParts.build_learner`` whose learners first append each batch they update on to ``batches``.

    ``build_learner``: the builder wrapped (default: the config's, ``setup.build_learner``).
    """
    from agentenv.trainer import setup

    build = build_learner or setup.build_learner

    def recording(cfg, model):
        learner = build(cfg, model)
        update = learner.update

        def recorded(trajectories, *, scores=None):
            batches.append(list(trajectories))
            return update(trajectories, scores=scores)

        learner.update = recorded
        return learner

    return recording


class CharRenderer(Renderer):
    """One token per character (code point mod 256); ``EOT`` ends a turn; no tool-call parser (the default)."""

    stop_token_ids = (EOT,)

    def initial_prompt(self, user_text, *, system=None, tools=()):
        return [ord(c) % 256 for c in f"U:{user_text}\nA:"]

    def observation_tokens(self, role, content):
        return [ord(c) % 256 for c in f"{role[0].upper()}:{content}\nA:"]

    def decode(self, ids, *, keep_special=False):
        return "".join(chr(i) if i != EOT else "<EOT>" for i in ids if keep_special or i != EOT)


class ScriptedEngine:
    """Replies with scripted strings; ``switch_at`` maps a reply index to a token offset at which
    the version is bumped mid-reply (simulating a weight update landing)."""

    def __init__(self, replies: Sequence[str], *, max_context_tokens: int = 10_000, fail_on: int | None = None):
        self.replies = list(replies)
        self._version = 0
        self.calls: list[list[int]] = []
        self.switch_at: dict[int, list[int]] = {}
        self._max_context = max_context_tokens
        self.fail_on = fail_on

    @property
    def version(self) -> int:
        return self._version

    @property
    def max_context_tokens(self) -> int:
        return self._max_context

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        idx = len(self.calls)
        self.calls.append(list(prompt_ids))
        if self.fail_on is not None and idx == self.fail_on:
            raise EngineError("engine died")
        await asyncio.sleep(0)
        text = self.replies[idx % len(self.replies)]
        ids = [ord(c) for c in text][: params.max_new_tokens - 1] + [EOT]
        ids = ids[: params.max_new_tokens]
        spans = []
        start = 0
        for cut in self.switch_at.get(idx, []) + [len(ids)]:
            if cut > start:
                prefix = self._version if not spans else spans[0].prefix_version
                spans.append(TokenSpan(cut - start, self._version, prefix))
            if cut < len(ids):
                self._version += 1
            start = cut
        finish = "stop" if ids[-1] == EOT else "length"
        return GenerationOutput(ids, [-0.5] * len(ids), spans, finish)

    async def update_weights(self, weights, version):
        self._version = version

    async def close(self):
        pass


class CountdownEnv(Env[str, str]):
    """Say 'done' to win; each other reply costs a turn. Observation role: user."""

    def __init__(self, limit: int = 10, raise_on_step: bool = False):
        self.limit = limit
        self.raise_on_step = raise_on_step
        self._t = None

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        self._t = 0
        return f"task{seed}", {"task_id": f"t{seed}"}

    async def step(self, action):
        if self._t is None:
            raise ResetNeeded("reset first")
        if self.raise_on_step:
            raise RuntimeError("env exploded")
        self._t += 1
        if "done" in action:
            return StepResult("won", 1.0, True, False, {"steps": self._t})
        return StepResult(f"again{self._t}", 0.0, False, self._t >= self.limit, {"steps": self._t})


class EvenCharEnv(Env[str, str]):
    """Reply with a character; reward 1.0 when its code point is even (about half of a random model's replies).

    One step per episode; a reply cut by the token budget is graded as it is (``cut_turn = "act"``).
    """

    cut_turn: ClassVar[str] = "act"

    async def reset(self, *, seed=None, options=None):
        await super().reset(seed=seed)
        return "pick", {"task_id": f"even-{seed}"}

    async def step(self, action):
        return StepResult("", 1.0 if action and ord(action[0]) % 2 == 0 else 0.0, True, False, {})


def tiny_llama(*, vocab_size: int = 1024, hidden_size: int = 32, max_position_embeddings: int = 64):
    """A random one-layer Llama (seed 0), in eval mode: a real transformers model in milliseconds."""
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=max_position_embeddings)
    return transformers.LlamaForCausalLM(cfg).eval()
