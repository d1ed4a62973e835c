"""python_tool's scripted demonstrations (the warm-up's transcripts) and the warm-up's cache key.

Moving the scripted solver from the trainer into the environment (``Env.scripted_demonstrations``)
must change no token, so that a cached warm-up stays valid: the reference below is a verbatim copy
of the code before the move (``trainer/warmup.py`` at commit 02de162: ``scripted_problem``,
``tool_call_text``, ``build_transcript``, called by ``trainer/setup.py`` with ``random.Random(seed)``,
python_tool's system prompt and tool schema, and tool results formatted with 4000 characters kept).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.chat import ChatRenderer
from agentenv.configio import to_dict
from agentenv.core import Env, has_scripted_demonstrations
from agentenv.envs.python_tool import PYTHON_TOOL_SCHEMA, SYSTEM_PROMPT, PythonToolEnv, format_result
from agentenv.models import chat_template
from agentenv.sandboxes.base import ExecResult, ExecStatus
from agentenv.trainer import setup
from agentenv.trainer.recipe import parse_args
from tests.smollm_tokenizer import smollm_tokenizer


# -- the reference: the code before the move, verbatim but for the names ---------------------------
@dataclass(frozen=True)
class _RefSolution:
    problem: str
    code: str
    answer: str


def _ref_fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def _ref_problem(rng: random.Random) -> _RefSolution:
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
    return _RefSolution(problem, code, _ref_fmt(val))


def _ref_call_text(code: str) -> str:
    """The assistant text of one ``python`` tool call in the Hermes/Qwen2.5 format."""
    return "<tool_call>\n" + json.dumps({"name": "python", "arguments": {"code": code}}) + "\n</tool_call>"


def _ref_transcript(
    renderer: Any,
    encode: Callable[[str], list[int]],
    solution: _RefSolution,
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
    call = encode(_ref_call_text(solution.code)) + eot
    obs = renderer.observation_tokens("tool", format_observation(solution.answer + "\n"))
    final = encode(f"The code prints {solution.answer}, so the answer is $\\boxed{{{solution.answer}}}$.") + eot
    ids = prompt + call + obs + final
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
    return ids, mask


def _reference(renderer, encode, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    fmt = lambda out: format_result(ExecResult(ExecStatus.OK, stdout=out), 4000)  # noqa: E731
    return [
        _ref_transcript(
            renderer,
            encode,
            _ref_problem(rng),
            system=SYSTEM_PROMPT,
            tools=(PYTHON_TOOL_SCHEMA,),
            format_observation=fmt,
        )
        for _ in range(count)
    ]


# -- the tests ---------------------------------------------------------------------------------------
def test_demonstrations_are_the_transcripts_the_warm_up_always_trained_on():
    tok = smollm_tokenizer()
    renderer = ChatRenderer(tok, chat_template())
    encode = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    demos = PythonToolEnv.scripted_demonstrations(renderer, encode, count=320, seed=0)
    reference = _reference(renderer, encode, 320, 0)
    assert len(demos) == 320 and [list(map(list, d)) for d in demos] == [list(map(list, r)) for r in reference]
    ids, mask = demos[0]
    assert len(ids) == len(mask) > 100 and 0 < sum(mask) < len(mask) and set(mask) == {0, 1}
    assert renderer.stop_token_ids[0] in ids
    assert tok.decode([i for i, m in zip(ids, mask, strict=True) if m]).count("<tool_call>") == 1
    other = PythonToolEnv.scripted_demonstrations(renderer, encode, count=3, seed=1)
    assert other == _reference(renderer, encode, 3, 1) and other != demos[:3]


def test_the_hook_is_declared_by_python_tool_only():
    assert has_scripted_demonstrations(PythonToolEnv)
    assert not has_scripted_demonstrations(Env) and not has_scripted_demonstrations(lambda: None)


def test_the_warm_up_cache_key_of_the_cpu_default_is_unchanged():
    cfg, _ = parse_args(["--recipe", "python_tool_cpu"])
    before = hashlib.sha256(json.dumps([cfg.model.name, to_dict(cfg.warmup), 3]).encode()).hexdigest()[:12]
    # the key the warm-up of the CPU default was cached under before the move (a run's cache folder)
    assert setup.warmup_cache_key(cfg) == before == "6fcd5ba1fd4e"

    # an env with its own demonstrations and the default tag gets a key of its own
    class Other(PythonToolEnv):
        demonstrations_tag = None

    import agentenv

    agentenv.register("tests/OtherTool-v0", Other)
    try:
        other, _ = parse_args(["--recipe", "python_tool_cpu", "--env", "tests/OtherTool-v0"])
        assert setup.warmup_cache_key(other) != before
    finally:
        agentenv.registry.pop("tests/OtherTool-v0")
