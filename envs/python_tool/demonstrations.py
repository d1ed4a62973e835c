r"""Scripted tool-use demonstrations for the warm-up (:meth:`PythonToolEnv.scripted_demonstrations`).

A small instruct model (the embedded SmolLM2-135M default) makes no tool calls at first, so
reinforcement learning would see no successful rollout to reinforce. These demonstrations are easy
arithmetic problems in the style of MATH's "Compute ..." questions, each answered by a scripted
solver with one ``python`` tool call whose output it reads back, and a final ``\boxed{}`` answer; a
few supervised steps on them (:func:`agentenv.trainer.warmup.sft_warmup`) teach the call format.
They are chat messages; the trainer renders them with the policy's chat template, in the call
syntax of its tool-call family (:mod:`agentenv.trainer.demonstrations`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.core import Demonstration


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


def demonstration(
    solution: ScriptedSolution,
    *,
    system: str | None,
    tools: Sequence[Mapping[str, Any]],
    observation_role: str,
    format_observation: Callable[[str], str],
) -> Demonstration:
    """One scripted episode as chat messages: the problem, one ``python`` call, its output, the boxed answer.

    Args:
        solution: The scripted problem and solution.
        system: System prompt of the environment.
        tools: Tool schemas of the environment.
        observation_role: The role the environment's observations have (``"tool"``).
        format_observation: Renders the tool's stdout as the environment would.
    """
    call = {"type": "function", "function": {"name": "python", "arguments": {"code": solution.code}}}
    final = f"The code prints {solution.answer}, so the answer is $\\boxed{{{solution.answer}}}$."
    return Demonstration(
        messages=({"role": "user", "content": solution.problem},
                  {"role": "assistant", "tool_calls": [call]},
                  {"role": observation_role, "content": format_observation(solution.answer + "\n")},
                  {"role": "assistant", "content": final}),
        system=system, tools=tuple(tools))
