"""Procedural tool-use problems: reproducible, exact answers, train and eval sets disjoint."""

from __future__ import annotations

import math
import re

import pytest

from agentenv.envs.python_tool.datasets import dataset_names, load_math
from agentenv.envs.python_tool.procedural import PROCEDURAL_SETS, load_procedural
from agentenv.errors import DataError


@pytest.mark.parametrize("name", ["tool_arith", "tool_expr"])
def test_sets_are_registered_and_disjoint(name):
    train, held = load_math(f"{name}_train"), load_math(f"{name}_eval")
    assert {f"{name}_train", f"{name}_eval"} <= set(dataset_names())
    assert len(train) > 1500 and len(held) >= 200
    assert not {p.problem for p in train} & {p.problem for p in held}
    assert len({p.id for p in train}) == len(train) and len({p.problem for p in held}) == len(held)
    assert load_procedural(f"{name}_eval") == held  # same seeds, same problems


def test_the_expression_sets_hold_one_kind():
    for name in ("tool_expr_train", "tool_expr_eval"):
        assert {p.id.split("/")[1] for p in load_math(name)} == {"basic_arithmetic"}


def test_reference_answers_are_the_exact_values():
    checked = 0
    for p in load_math("tool_arith_eval")[:60]:
        if p.id.split("/")[1] == "lcm":
            a, b = map(int, re.findall(r"\d+", p.problem.split(":")[1]))
            assert int(p.answer) == math.lcm(a, b)
        else:
            expr = p.problem.removeprefix("Calculate ").rstrip(".")
            assert int(p.answer) == round(eval(expr, {"__builtins__": {}}))  # noqa: S307 (generated arithmetic)
        checked += 1
    assert checked == 60


def test_families_interleave_and_unknown_names_fail():
    held = load_math("tool_arith_eval")
    assert [p.id.split("/")[1] for p in held[:4]] == ["lcm", "basic_arithmetic"] * 2
    with pytest.raises(DataError, match="tool_arith_train"):
        load_procedural("nope")
    assert PROCEDURAL_SETS["tool_arith_eval"].exclude == "tool_arith_train"
