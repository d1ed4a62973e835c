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


#: Chat template families (:data:`agentenv.tool_calls.TOOL_PARSERS`) the scripted demonstrations write
#: a call for; ``harmony`` (gpt-oss) is refused: its replies are channel messages, not call text.
DEMONSTRATION_FAMILIES = ("hermes", "qwen25", "qwen3", "llama3_json", "deepseek", "mistral")


def tool_call_text(code: str, family: str = "hermes") -> str:
    r"""The assistant text of one ``python`` tool call in the call syntax of ``family``.

    ``hermes``/``qwen25``/``qwen3``: ``<tool_call>\n{json}\n</tool_call>``; ``llama3_json``: the JSON
    object with ``parameters``; ``deepseek``: the V3 call markers around a fenced JSON block;
    ``mistral``: ``[TOOL_CALLS]`` and a JSON list.

    Raises:
        TemplateError: ``family`` is not one of :data:`DEMONSTRATION_FAMILIES`.
    """
    from agentenv.errors import TemplateError

    args = {"code": code}
    if family in ("hermes", "qwen25", "qwen3"):
        return "<tool_call>\n" + json.dumps({"name": "python", "arguments": args}) + "\n</tool_call>"
    if family == "llama3_json":
        return json.dumps({"name": "python", "parameters": args})
    if family == "deepseek":
        return ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>python\n```json\n"
                + json.dumps(args) + "\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>")
    if family == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": "python", "arguments": args}])
    raise TemplateError(f"the warm-up's scripted demonstrations cannot write a tool call for the chat template "
                        f"family {family!r} (they write {', '.join(DEMONSTRATION_FAMILIES)}); set warmup.steps=0")


def template_family(renderer: Any) -> str:
    """The tool-call family of the renderer's chat template (``renderer.tool_parser_name``), else ``"hermes"``.

    ``"hermes"`` is also what :class:`~agentenv.envs.python_tool.env.PythonToolEnv` parses when the
    template implies no family.
    """
    return renderer.tool_parser_name or "hermes"


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

    The tool call is written in the call syntax of the chat template's family (:func:`template_family`,
    :func:`tool_call_text`). With a renderer that keeps the conversation (``agentenv.chat``), the
    transcript is built as the rollout builds an episode (``Conversation``: the replies as the model's
    ids, each observation rendered against the real history, so templates that rewrite earlier turns,
    Qwen3's, work too), each reply starts with what the template writes before an assistant answer
    (Qwen3's empty think block in thinking mode), and each reply is read back with the family's
    tool-call parser: the call must parse as this ``python`` call and the answer as no call.

    Args:
        renderer: ``agentenv.chat.ChatRenderer`` (initial_prompt, observation_tokens, stop_token_ids,
            tool_parser_name; ``conversation`` when it has it).
        encode: Tokenizer encoding of assistant text without special tokens.
        solution: The scripted problem and solution.
        system: System prompt of the environment.
        tools: Tool schemas of the environment.
        format_observation: Renders the tool's stdout as the environment would.

    Returns:
        ``(ids, mask)``, both ``(L,)``; mask is 1 on assistant tokens (their end of turn included).

    Raises:
        TemplateError: The template's family has no scripted call (:func:`tool_call_text`), the
            template failed to render, or a reply does not read back as written (the message names
            the family).
    """
    from agentenv.rollout import ConversationRenderer

    eot = [renderer.stop_token_ids[0]]
    family = template_family(renderer)
    call_text = tool_call_text(solution.code, family)
    final_text = f"The code prints {solution.answer}, so the answer is $\\boxed{{{solution.answer}}}$."
    observation = format_observation(solution.answer + "\n")
    if not isinstance(renderer, ConversationRenderer):  # a plain renderer: observation deltas, as the rollout does
        prompt = renderer.initial_prompt(solution.problem, system=system, tools=list(tools))
        call = encode(call_text) + eot
        obs = renderer.observation_tokens("tool", observation)
        final = encode(final_text) + eot
    else:
        conv = renderer.conversation(solution.problem, system=system, tools=list(tools))
        prompt = list(conv.prompt_ids)
        opening = _reply_opening(renderer, system, tools)
        call = encode(opening + call_text) + eot
        _check_reply(conv.add_reply(call), family, solution.code)
        obs = list(conv.observe("tool", observation, policy="append").ids)
        final = encode(opening + final_text) + eot
        _check_reply(conv.add_reply(final), family, None)
    ids = prompt + call + obs + final
    mask = [0] * len(prompt) + [1] * len(call) + [0] * len(obs) + [1] * len(final)
    return ids, mask


_PROBE = "agentenv-demonstration-answer"


def _reply_opening(renderer: Any, system: str | None, tools: Sequence[dict]) -> str:
    r"""What the template writes at the start of an assistant answer after its generation prompt.

    ``"<think>\n\n</think>\n\n"`` for Qwen3 in thinking mode (the model opens every reply with its
    reasoning; an answer without reasoning has an empty block), ``""`` for templates whose
    generation prompt already holds it or that have none.
    """
    conv = renderer.conversation(_PROBE, system=system, tools=list(tools))
    asked = renderer.decode(conv.prompt_ids, keep_special=True)
    answered = renderer.conversation_from(
        [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": _PROBE},
         {"role": "assistant", "content": _PROBE}], tools=list(tools))
    text = renderer.decode(answered.prompt_ids, keep_special=True)
    if not text.startswith(asked):
        return ""
    rest = text[len(asked):]
    at = rest.find(_PROBE)
    return rest[:at] if at > 0 else ""


def _check_reply(text: str, family: str, code: str | None) -> None:
    """Raise unless the family's parser reads ``text`` as one ``python`` call of ``code`` (None: no call)."""
    from agentenv.errors import TemplateError
    from agentenv.tool_calls import get_tool_parser

    parsed = get_tool_parser(family).parse(text)
    if code is None:
        ok = not parsed.attempted
    else:
        ok = (not parsed.errors and len(parsed.calls) == 1 and parsed.calls[0].name == "python"
              and dict(parsed.calls[0].arguments) == {"code": code})
    if not ok:
        what = "the answer as no tool call" if code is None else "the python call"
        raise TemplateError(f"the warm-up's scripted reply does not read back as {what} with the {family!r} "
                            f"tool-call parser of this chat template: {text[:200]!r}")
