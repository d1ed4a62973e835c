r"""Scripted tool-use demonstrations for the warm-up (:meth:`PythonToolEnv.scripted_demonstrations`).

A small instruct model (the embedded SmolLM2-135M default) makes no tool calls at first, so
reinforcement learning would see no successful rollout to reinforce. These demonstrations are easy
arithmetic problems in the style of MATH's "Compute ..." questions, each answered by a scripted
solver with one ``python`` tool call whose output it reads back, and a final ``\boxed{}`` answer; a
few supervised steps on them (:func:`agentenv.trainer.warmup.sft_warmup`) teach the call format.
The transcripts are built with the same renderer as rollouts (prompt ids, assistant ids,
observation deltas), so the model learns exactly the token layout it will later generate into.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


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
