r"""Tool-use warm-up: a short supervised step on transcripts a scripted solver writes.

A small instruct model (the embedded SmolLM2-135M default) makes no tool calls at first, so
reinforcement learning would see no successful rollout to reinforce. The warm-up writes easy
arithmetic problems in the style of MATH's "Compute ..." questions, a scripted solver that answers
each with one ``python`` tool call whose output it reads back, and a final ``\boxed{}`` answer;
a few supervised steps on those transcripts teach the call format. The transcripts are built with
the same renderer as rollouts (prompt ids, assistant ids, observation deltas), so the model learns
exactly the token layout it will later generate into.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentenv.errors import ConfigError, Interrupted
from agentenv.trainer.batching import build_batch
from agentenv.trainer.learner import token_logprobs
from agentenv.trajectory import Trajectory


@dataclass(frozen=True)
class WarmupConfig:
    """Supervised tool-use warm-up.

    Attributes:
        steps: Optimizer steps (0 disables the warm-up).
        batch_size: Transcripts per step.
        lr: AdamW learning rate.
        num_examples: Distinct synthetic transcripts written (cycled through).
        seed: Seeds the problem generator and the batch order.
    """

    steps: int = 40
    batch_size: int = 8
    lr: float = 5e-5
    num_examples: int = 320
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.num_examples < 1:
            raise ConfigError("warmup.steps must be >= 0, batch_size and num_examples >= 1")
        if self.lr <= 0:
            raise ConfigError(f"warmup.lr must be > 0, got {self.lr}")


@dataclass(frozen=True)
class ScriptedSolution:
    """One scripted episode: the problem, the Python the solver writes, and the answer text."""

    problem: str
    code: str
    answer: str


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def scripted_problem(rng: random.Random) -> ScriptedSolution:
    """Write one easy problem (LaTeX, as in MATH) and the solver's Python for it."""
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 30)
    kind = rng.randrange(6)
    if kind == 0:
        latex, code, val = f"{a} \\times {b} + {c}", f"print({a} * {b} + {c})", a * b + c
    elif kind == 1:
        latex, code, val = f"{a}^2 - {b}", f"print({a}**2 - {b})", a * a - b
    elif kind == 2:
        latex, code, val = f"\\sqrt{{{a * a}}} + {b}", f"import math\nprint(math.isqrt({a * a}) + {b})", a + b
    elif kind == 3:
        latex, code, val = f"({a} + {b}) \\cdot {c}", f"print(({a} + {b}) * {c})", (a + b) * c
    elif kind == 4:
        latex, code = f"\\left\\lceil \\frac{{{a}}}{{{c}}} \\right\\rceil", f"import math\nprint(math.ceil({a} / {c}))"
        val = math.ceil(a / c)
    else:
        latex, code, val = f"{a} \\cdot {b} - {c} \\cdot {a}", f"print({a} * {b} - {c} * {a})", a * b - c * a
    verb = rng.choice(["Compute", "Evaluate", "What is", "Find the value of"])
    problem = f"{verb} ${latex}$." if not verb.startswith("What") else f"{verb} ${latex}$?"
    return ScriptedSolution(problem, code, _fmt(val))


def tool_call_text(code: str) -> str:
    """The assistant text of one ``python`` tool call in the Hermes/Qwen2.5 format."""
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def build_transcript(
    renderer: Any,
    encode: Callable[[str], list[int]],
    solution: ScriptedSolution,
    *,
    system: str | None,
    tools: Sequence[dict],
    format_observation: Callable[[str], str],
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of one scripted episode, laid out exactly as a rollout would be.

    Args:
        renderer: ``agentenv.chat.ChatRenderer`` (initial_prompt, observation_tokens, stop_token_ids).
        encode: Tokenizer encoding of assistant text without special tokens.
        solution: The scripted problem and solution.
        system: System prompt of the environment.
        tools: Tool schemas of the environment.
        format_observation: Renders the tool's stdout as the environment would.

    Returns:
        ``(ids, mask)``, both ``(L,)``; mask is 1 on assistant tokens (their end of turn included).
    """
    eot = [renderer.stop_token_ids[0]]
    prompt = renderer.initial_prompt(solution.problem, system=system, tools=list(tools))
    call = encode(tool_call_text(solution.code)) + eot
    obs = renderer.observation_tokens("tool", format_observation(solution.answer + "\n"))
    final = encode(f"The code prints {solution.answer}, so the answer is $\\boxed{{{solution.answer}}}$.") + eot
    ids = prompt + call + obs + final
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
    return ids, mask


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
        examples: ``(ids, mask)`` pairs from :func:`build_transcript`.
        cfg: Steps, batch size, learning rate, seed.
        log: Called as ``log(step, loss)`` after each step.
        should_stop: Checked before each step (e.g. Ctrl-C seen by another thread).

    Returns:
        The loss of every step (nats per assistant token).

    Raises:
        Interrupted: ``should_stop()`` returned true; the model is left part-trained.
    """
    rng = random.Random(cfg.seed)
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
