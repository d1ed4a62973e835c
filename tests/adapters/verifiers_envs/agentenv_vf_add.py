"""A verifiers environment written against verifiers' public API: a ToolEnv with one ``add`` tool.

Loaded by the ``verifiers/agentenv-vf-add`` tests under .venv-verifiers's interpreter (this folder on
its PYTHONPATH), never imported by agentenv's own interpreter. Three training rows and two eval rows;
the rubric pays 1.0 when the last assistant message holds the sum, and a second, zero-weight function
reports the tool calls as a metric.
"""

import verifiers as vf
from datasets import Dataset

TRAIN = [(2, 3), (10, 7), (4, 4)]
EVAL = [(20, 22), (1, 1)]


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def _field(message, name):
    return message.get(name) if isinstance(message, dict) else getattr(message, name, None)


def _rows(pairs):
    return Dataset.from_list([{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a, b in pairs])


def load_environment(max_turns: int = 3, boom: bool = False):
    """``boom``: the environment fails to load (a clear error is expected)."""
    if boom:
        raise RuntimeError("this environment was asked to fail")

    def correct(completion, answer) -> float:
        said = [_field(m, "content") or "" for m in completion if _field(m, "role") == "assistant"]
        return 1.0 if said and answer in said[-1] else 0.0

    def tool_calls(completion) -> float:
        return float(sum(len(_field(m, "tool_calls") or []) for m in completion if _field(m, "role") == "assistant"))

    rubric = vf.Rubric(funcs=[correct, tool_calls], weights=[1.0, 0.0])
    return vf.ToolEnv(dataset=_rows(TRAIN), eval_dataset=_rows(EVAL), tools=[add], rubric=rubric,
                      max_turns=max_turns, system_prompt="Use the add tool, then state the sum.")
