"""The ``python`` tool: its JSON schema, argument checks and how results are shown to the model."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentenv.sandboxes import ExecResult, ExecStatus

TOOL_NAME = "python"

PYTHON_TOOL_SCHEMA: Mapping[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Run Python 3 code in a persistent sandbox (variables and imports survive between calls "
            "in this episode; no network). Only printed output is returned, so print what you need."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source code to execute."}},
            "required": ["code"],
        },
    },
}

SYSTEM_PROMPT = (
    "You are a helpful assistant that solves math problems step by step. You can call the `python` "
    "tool to run Python code (sympy and the standard library may help); variables persist between "
    "calls, and only what the code prints is shown to you. When you know the answer, reply without "
    "a tool call and put the final answer in \\boxed{}."
)

_RESTARTED = {
    ExecStatus.TIMEOUT: "the code ran past the time limit and was stopped",
    ExecStatus.CRASHED: "the Python worker crashed",
    ExecStatus.OOM: "the code ran out of memory",
}


def check_arguments(name: str, arguments: Mapping[str, Any]) -> str | None:
    """Return the code to run, or raise ``ValueError`` with a message for the model.

    Raises:
        ValueError: Unknown tool, missing/non-string ``code``, or code that is only whitespace.
    """
    if name != TOOL_NAME:
        raise ValueError(f"unknown tool {name!r}; the only tool is {TOOL_NAME!r}")
    code = arguments.get("code")
    if not isinstance(code, str):
        raise ValueError("the python tool needs a string argument 'code'")
    if not code.strip():
        raise ValueError("the 'code' argument is empty")
    return code


def _cap(text: str, limit: int, printed: int | None = None) -> str:
    """``text`` cut to ``limit`` characters; the note counts what the snippet ``printed`` that is not shown."""
    shown = text[:limit]
    cut = max(printed or 0, len(text)) - len(shown)
    return shown if cut <= 0 else shown + f"\n... [{cut} more characters cut]"


def format_result(result: ExecResult, max_chars: int) -> str:
    """One tool result as text for the model: status line, stdout, stderr, error.

    A snippet that raised says so (``status: error`` plus the traceback), so crashing code is never
    shown as a success.

    Args:
        result: The sandbox's :class:`~agentenv.sandboxes.ExecResult`.
        max_chars: Characters kept of each of stdout, stderr and error text.
    """
    lines = [f"status: {result.status.value}"]
    if result.status in _RESTARTED:
        lines[0] += (
            f" ({_RESTARTED[result.status]}; the sandbox was restarted and earlier variables are lost)"
        )
    if result.stdout:
        lines.append("stdout:\n" + _cap(result.stdout, max_chars, result.stdout_chars).rstrip("\n"))
    if result.stderr:
        lines.append("stderr:\n" + _cap(result.stderr, max_chars, result.stderr_chars).rstrip("\n"))
    if result.error:
        lines.append("error:\n" + _cap(result.error, max_chars).rstrip("\n"))
    if result.output_truncated:
        lines.append("(output was cut to the sandbox's output limit)")
    if result.ok and not (result.stdout or result.stderr):
        lines.append("(no output; use print() to see values)")
    return "\n".join(lines)
