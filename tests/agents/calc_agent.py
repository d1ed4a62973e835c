"""A small multi-turn agent written against the OpenAI API with the ``openai`` package: its own loop and tool.

Used by the tests as a callable (``solve``), as an unmodified script (``python calc_agent.py`` reads
``OPENAI_BASE_URL``/``OPENAI_API_KEY`` like any ``OpenAI()`` program, the task from ``AGENTENV_TASK``),
and, rewriting its history each turn, as ``forgetful``.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
TASKS = [{"id": f"add-{a}-{b}", "a": a, "b": b} for a, b in ((2, 3), (4, 5), (7, 1), (6, 6))]
TURNS = 3


def run(task: dict, client: OpenAI, model: str, *, turns: int = TURNS, forget: bool = False) -> str:
    """Ask, run the tool calls the model makes, nudge it when it makes none; return its last answer."""
    system = {"role": "system", "content": "Use the add tool, then give the sum."}
    messages = [system, {"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    answer = ""
    for turn in range(turns):
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=4,
                                               temperature=0.7)
        msg = reply.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        for call in msg.tool_calls or []:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
        if not msg.tool_calls:
            answer = msg.content or ""
            messages.append({"role": "user", "content": f"Check it once more (turn {turn + 1})."})
        if forget:  # keep only the system prompt and the newest message: a history rewrite
            messages = [system, messages[-1]]
    return answer


def solve(task, ctx):
    return run(task, ctx.client(), ctx.model)


def forgetful(task, ctx):
    return run(task, ctx.client(), ctx.model, forget=True)


def score(task, output):
    return float(str(task["a"] + task["b"]) in (output or ""))


if __name__ == "__main__":
    print(run(json.loads(os.environ["AGENTENV_TASK"]), OpenAI(), os.environ["AGENTENV_MODEL"]))
