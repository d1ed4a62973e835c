r"""Grading a final ``\\boxed{}`` answer with math-verify, in worker processes killed on a deadline.

math-verify has two traps (docs/architecture.md, "Known pitfalls"): its timeouts use ``signal.alarm``, which
raises outside the main thread, and with them off a pathological answer can hang the caller; and it
reads several ``\\boxed{}`` in one text as a set. So:

* the *last* ``\\boxed{...}`` (or ``\\fbox{...}``) is chosen here, with a brace-matching scan, and only
  that answer is graded; only when it is wrong, the reference is a list or set and the reply ends with
  a group of one-item boxes (``\\boxed{2}`` and ``\\boxed{3}``) is that group graded as one set;
* both sides are normalised before math-verify (thousands separators, currency, units, percent,
  scientific notation, repeating decimals), inequalities may match intervals, and an exact sympy
  comparison overrides math-verify's float tolerance wherever both sides are exact numbers.
  The rules, and the misses still known, are in ``docs/grading.md``;
* grading runs in a worker subprocess (:data:`_WORKER_COMMAND`, math-verify's own timeouts off); the caller waits at
  most ``timeout_s`` seconds, then kills the worker and a fresh one replaces it. This is safe from
  any thread and, through :func:`grade_answer_async`, from async code.

Who is at fault when grading does not finish (docs/grading.md, "Timeouts"): a worker that spent at
least :data:`_ANSWER_CPU_SHARE` of the deadline computing was busy with the answer, which is too
expensive to verify: graded wrong with reason ``"timeout after N s"`` (``timed_out``), the policy's
doing. A worker that passed the deadline without computing (stopped, or starved of CPU) or died is
the grader's failure (``fault``): the answer was not graded and must not be scored.

An answer the grader cannot parse is graded wrong with a reason; grading raises only when a worker
cannot be started.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentenv.errors import ConfigError
from agentenv.faults import FAULTS

#: ``verify_fn(extracted, golds) -> (correct, reason)``; runs inside the worker process.
VerifyFn = Callable[[str, list[str]], tuple[bool, str]]

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_LOG10_2 = math.log10(2)


@dataclass(frozen=True)
class GradeResult:
    r"""The verdict on one response.

    Attributes:
        correct: True only when the final boxed answer matches a ground truth.
        extracted: The content of the last ``\\boxed{}``, or None when there is none; when the answer
            was accepted as a group of boxes, their contents joined by ``", "``.
        reason: ``"correct"`` (``"correct (several boxes read as one set)"`` for a box group),
            ``"wrong"``, or why the answer could not be graded.
        duration_s: Wall-clock seconds spent grading (waiting for a free worker excluded).
        fault: ``"timeout"`` (the worker passed the deadline without computing: stopped or starved
            of CPU; it was killed) or ``"crashed"`` (the worker died): the answer was not graded,
            for reasons outside the policy; else None.
        timed_out: The answer was too expensive to verify: the worker computed on it until the
            deadline and was killed. A verdict (wrong, reason ``"timeout after N s"``), not a fault.
    """

    correct: bool
    extracted: str | None
    reason: str
    duration_s: float = 0.0
    fault: str | None = None
    timed_out: bool = False


def _box_span(text: str, start: int) -> tuple[str, int] | None:
    r"""Content and end index of the box command ending at ``start`` (``{...}`` or ``\\boxed 5``)."""
    i = start
    if i < len(text) and text[i] == "{":
        depth = 0
        j = i
        while j < len(text):
            c = text[j]
            if c == "\\":  # a LaTeX escape (\{, \}, \\): skip the escaped character
                j += 2
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1 : j], j + 1
            j += 1
        return None
    if i < len(text) and text[i] == " ":
        j = i + 1
        while j < len(text) and not text[j].isspace() and text[j] not in "$":
            j += 1
        return (text[i + 1 : j], j) if j > i + 1 else None
    return None


def _boxed_at(text: str, start: int) -> str | None:
    r"""Content of the box command ending at ``start`` (``{...}`` or ``\\boxed 5``), else None."""
    span = _box_span(text, start)
    return None if span is None else span[0]


def extract_last_boxed(text: str) -> str | None:
    r"""Return the content of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``.

    Nested braces are matched (``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}``); ``\\boxed 5`` gives
    ``5``. Returns None when there is no complete box, or the last one is empty.

    Raises:
        Nothing: any text is accepted.
    """
    best: tuple[int, str] | None = None
    for cmd in _BOX_COMMANDS:
        pos = text.find(cmd)
        while pos >= 0:
            content = _boxed_at(text, pos + len(cmd))
            if content is not None and (best is None or pos > best[0]):
                best = (pos, content)
            pos = text.find(cmd, pos + 1)
    if best is None or not best[1].strip():
        return None
    return best[1].strip()


def _outer_boxes(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, content)`` of every complete, non-nested box in ``text``, in order."""
    found = []
    for cmd in _BOX_COMMANDS:
        pos = text.find(cmd)
        while pos >= 0:
            span = _box_span(text, pos + len(cmd))
            if span is not None:
                found.append((pos, span[1], span[0].strip()))
            pos = text.find(cmd, pos + 1)
    found.sort()
    out: list[tuple[int, int, str]] = []
    for box in found:
        if out and box[0] < out[-1][1]:
            continue  # a box inside the previous one
        out.append(box)
    return out


#: Most characters (other than spaces and ``$``) between two boxes of one final answer group.
_GROUP_GAP_CHARS = 40


def extract_final_box_group(text: str) -> list[str]:
    r"""The boxed answers of the final group: the last box and the boxes just before it.

    Boxes belong to one group when at most 40 characters (spaces and ``$`` not counted) separate
    each from the next, as in ``$x = \\boxed{2}$ or $x = \\boxed{3}$``. Returns ``[]`` when the text
    has no complete box; empty boxes are skipped.

    Raises:
        Nothing: any text is accepted.
    """
    boxes = _outer_boxes(text)
    group: list[str] = []
    nxt: int | None = None
    for start, end, content in reversed(boxes):
        if nxt is not None:
            gap = text[end:nxt]
            if len("".join(gap.split()).replace("$", "")) > _GROUP_GAP_CHARS:
                break
        if content:
            group.append(content)
        nxt = start
    return group[::-1]


# --- normalisation (plain string work: runs in the caller and in the worker) -------------------

def _top_level_commas(s: str) -> int:
    r"""Commas outside any (), [], {}, ``\\{ \\}`` or ``\\left( \\right)`` nesting."""
    depth = 0
    count = 0
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\":
            if s.startswith("\\{", i) or s.startswith("\\left", i):
                depth += 1
                i += 2 if s.startswith("\\{", i) else 6
                continue
            if s.startswith("\\}", i) or s.startswith("\\right", i):
                depth -= 1
                i += 2 if s.startswith("\\}", i) else 7
                continue
            i += 2
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            count += 1
        i += 1
    return count


def _strip_math_delims(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$":
        s = s[1:-1].strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    return s


# Separators a thousands group may follow: {,}  ,\!  ,\,  ,\   \,  \!  \   \;  ~ (and plain spaces).
_EXPLICIT_SEP = r"(?:\{,\}|,\s*\\[!,;: ]\s*|\\[!,;: ]\s*|~)"
_EXPLICIT_GROUPS = re.compile(r"(?<![\d.])\d{1,3}(?:\s*" + _EXPLICIT_SEP + r"\d{3})+(?![\d])")
_PLAIN_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_SPACE_GROUPS = re.compile(r"(?<![\d.])\d{1,3}(?: \d{3})+(?![\d.])")
_SCI = re.compile(r"(?<![A-Za-z\\.\d])(\d+(?:\.\d+)?)[eE]([+-]?\d+)(?![\w.])")
_TEXT_CMD = r"\\(?:text|mbox|textrm|textnormal|mathrm|textup|rm)\s*"
_UNIT_WORDS = (
    "cm|mm|km|meters?|metres?|inch(?:es)?|feet|foot|ft|yards?|yd|miles?|mph|units?|degrees?|dollars?|"
    "cents?|seconds?|minutes?|mins?|hours?|hrs?|days?|weeks?|months?|years?|pounds?|lbs?|ounces?|oz|"
    "gallons?|liters?|litres?|grams?|kg|sq|square|cubic|people|students|ways|points?"
)
_TRAILING_TEXT_UNIT = re.compile(
    r"(?:\\[ ,;:!]|\s|~)*" + _TEXT_CMD + r"\{\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?\s*[23]\s*\}?)?\s*\.?\s*$"
)
_TRAILING_BARE_UNIT = re.compile(
    r"(?<=[\d}])(?:\\[ ,;:]|\s|~)+(?:(?:" + _UNIT_WORDS + r")\b\s*)+(?:\^\s*\{?\s*[23]\s*\}?)?\s*\.?\s*$"
)
_TEXT_NUMBER_UNIT = re.compile(r"^" + _TEXT_CMD + r"\{\s*(-?[\d.,]+)\s*[A-Za-z][A-Za-z .]*\}(?:\s*\^\s*\{?[23]\}?)?$")
_TEXT_CONJUNCTION = re.compile(r"\s*" + _TEXT_CMD + r"\{\s*,?\s*(?:and|or)\s*\}\s*")
_TEXT_OR = re.compile(r"\s*(?:" + _TEXT_CMD + r"\{\s*or\s*\}|\\vee\b|\\lor\b|(?<=\s)or(?=\s))\s*")
_RELATION = re.compile(r"<|>|\\[lg]eq?\b|\\[lg]t\b|\\leqslant|\\geqslant")
_REPEATING = re.compile(r"(?<![\d.])(\d*)\.(\d*)\\(?:overline|bar)\s*\{(\d+)\}")
_DEGREE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|\\degree\b|°")


def _normalise_answer(s: str, *, plain_commas: bool) -> str:
    r"""Rewrite one answer so math-verify reads it as meant (see docs/grading.md).

    ``plain_commas``: whether ``1,000`` (plain comma, groups of three, the whole answer or a whole
    ``{...}`` argument) is a thousands separator; the caller passes False when the other side is a
    list, so ``1,2``-like lists are never merged into one number.
    """
    s = _strip_math_delims(s)
    s = s.rstrip().rstrip(".").rstrip()
    s = s.replace("\\$", "").replace("\\%", "").replace("%", "")
    s = s.replace("\\displaystyle", "")
    m = _TEXT_NUMBER_UNIT.match(s)
    if m:  # \text{5 cm}
        s = m.group(1)
    if _RELATION.search(s):  # x < 2 \text{ or } x > 3: a union, read by the worker (_or_relations_set)
        s = _TEXT_OR.sub(lambda _: " \\lor ", s)
    else:
        s = _TEXT_CONJUNCTION.sub(", ", s)  # 6, 8\text{, and }10
    for _ in range(3):  # 5\ \text{cm}^2, 864 \mbox{ inches}^2, 5 cm
        t = _TRAILING_TEXT_UNIT.sub("", s)
        t = _TRAILING_BARE_UNIT.sub("", t)
        if t.strip() in ("", s.strip()):
            break
        s = t.rstrip()
    s = _DEGREE.sub("", s)
    # thousands separators
    s = _EXPLICIT_GROUPS.sub(lambda m: re.sub(r"\D", "", m.group(0)), s)
    s = _SPACE_GROUPS.sub(lambda m: m.group(0).replace(" ", ""), s)
    if plain_commas:
        if _PLAIN_NUMBER.fullmatch(s.strip()):
            s = s.replace(",", "")
        else:  # a whole brace argument: \frac{1}{29,322,216}
            s = re.sub(r"\{(\d{1,3}(?:,\d{3})+)\}", lambda m: "{" + m.group(1).replace(",", "") + "}", s)
    # math-verify reads 1,000 as 1000 even inside a list: make every other digit comma a list comma
    s = re.sub(r"(?<=\d),(?=\d)", ", ", s)
    # leftover LaTeX spacing
    s = re.sub(r"(?<!\\)\\!", "", s)
    s = re.sub(r"(?<!\\)\\[,;: ]|\\q?quad\b|~", " ", s)
    s = _SCI.sub(lambda m: _sci_latex(m), s)
    s = _REPEATING.sub(_repeating_fraction, s)
    return s.strip()


def _repeating_fraction(m: re.Match[str]) -> str:
    r"""``0.1\\overline{6}`` as the exact fraction ``\\frac{15}{90}``."""
    whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
    num = int(whole + fixed + rep) - int(whole + fixed)
    den = 10 ** len(fixed) * (10 ** len(rep) - 1)
    return f"\\frac{{{num}}}{{{den}}}"


def _sci_latex(m: re.Match[str]) -> str:
    mantissa, exponent = m.group(1), m.group(2)
    # 2e-1 may be 2e - 1 (Euler's e): only a decimal mantissa or a two-digit exponent is scientific
    if "." not in mantissa and len(exponent.lstrip("+-")) < 2:
        return m.group(0)
    return f"{mantissa}\\times 10^{{{exponent}}}"


def _is_list_answer(s: str) -> bool:
    r"""True when ``s`` (normalised) is a bare list ``2, 3`` or a set ``\\{2, 3\\}`` of 2+ items."""
    s = s.strip()
    for left, right in (("\\left\\{", "\\right\\}"), ("\\{", "\\}")):
        if s.startswith(left) and s.endswith(right):
            inner = s[len(left) : -len(right)]
            return _top_level_commas(inner) >= 1 and "\\{" not in inner
    return _top_level_commas(s) >= 1


def _normalise_pair(extracted: str, gold: str) -> tuple[str, str]:
    """Both sides normalised; plain-comma thousands only on a side whose partner has no comma at all."""
    pred_list = "," in _normalise_answer(extracted, plain_commas=False)
    gold_list = "," in _normalise_answer(gold, plain_commas=False)
    return (
        _normalise_answer(extracted, plain_commas=not gold_list),
        _normalise_answer(gold, plain_commas=not pred_list),
    )


def _golds(ground_truth: str | int | float | Sequence[str]) -> list[str]:
    if isinstance(ground_truth, (str, int, float)):
        items = [ground_truth]
    else:
        items = list(ground_truth)
    out = []
    for g in items:
        s = str(g).strip()
        if len(s) >= 2 and s[0] == "$" and s[-1] == "$":
            s = s.strip("$").strip()
        if s:
            out.append(s)
    return out


# --- exact comparison (sympy; runs in the worker) ----------------------------------------------

#: Most decimal digits of any number the exact check may build; past it the value is left to math-verify.
_MAX_EXACT_DIGITS = 20000

#: Largest argument of a factorial (or double factorial, binomial) the exact check evaluates.
_MAX_FACTORIAL_ARG = 5000


def _magnitude(expr: Any, digits: float) -> float:
    """``|expr|`` as a float, given ``digits`` (its :func:`_exact_digits`); inf when it has over 15 digits."""
    import sympy

    if digits > 15:
        return math.inf
    try:
        return abs(complex(sympy.N(expr, 20)))
    except (TypeError, ValueError, OverflowError):
        return math.inf


def _exact_digits(expr: Any) -> float:
    """Upper bound on the decimal digits of the numbers built when evaluating ``expr`` exactly.

    A rational counts the digits of its numerator and denominator; ``b^e`` counts ``|e|`` times the
    digits of ``b`` (an exponent whose own value has over 15 digits gives inf); a factorial of ``n``
    counts ``log10(n!)`` (inf past :data:`_MAX_FACTORIAL_ARG`); a sum, product or function the sum of
    its arguments' digits. Bounds built bottom-up in floats, so no huge number is ever built here:
    ``1/2^{1101}`` is about 332 digits, ``9^{9^{9^9}}`` inf.
    """
    import sympy

    if isinstance(expr, sympy.Integer):
        return expr.p.bit_length() * _LOG10_2 + 1
    if isinstance(expr, sympy.Rational):
        return (expr.p.bit_length() + expr.q.bit_length()) * _LOG10_2 + 2
    if isinstance(expr, sympy.Float):
        _, man, exp, bc = expr._mpf_  # man * 2**exp, man of bc bits (man 0: zero, inf or nan)
        return (bc + abs(exp)) * _LOG10_2 + 2 if man else 1.0
    if not expr.args:  # pi, E, I, ...
        return 1.0
    if isinstance(expr, sympy.Pow):
        base, exp = expr.args
        e = _magnitude(exp, _exact_digits(exp))
        return _exact_digits(base) * max(1.0, e)
    if isinstance(expr, (sympy.factorial, sympy.factorial2, sympy.binomial)):
        n = max(_magnitude(a, _exact_digits(a)) for a in expr.args)
        if n > _MAX_FACTORIAL_ARG:
            return math.inf
        return math.lgamma(n + 1) / math.log(10) + 1 + sum(_exact_digits(a) for a in expr.args)
    return sum(_exact_digits(a) for a in expr.args) + 1


def _too_big(expr: Any) -> bool:
    """True when evaluating ``expr`` exactly could build a number of more than ~20000 digits."""
    return _exact_digits(expr) > _MAX_EXACT_DIGITS


def _exact_value(expr: Any) -> Any:
    """``expr`` with decimals as exact rationals and unevaluated powers/factorials evaluated; or None."""
    import sympy

    if not isinstance(expr, sympy.Expr) or not expr.is_number or _too_big(expr):
        return None
    if expr.has(sympy.oo, -sympy.oo, sympy.zoo, sympy.nan):
        return None
    floats = {f: sympy.Rational(repr(float(f))) for f in expr.atoms(sympy.Float)}
    try:
        return expr.xreplace(floats).doit()
    except Exception:
        return None


def _unwrap_assignment(expr: Any) -> Any:
    import sympy

    if isinstance(expr, sympy.Eq) and isinstance(expr.lhs, sympy.Symbol):
        return expr.rhs
    return expr


def _exact_verdict(gold: Any, pred: Any) -> bool | None:
    r"""Exact comparison of two parsed answers: True/False where it is decidable, else None.

    Numbers compare as exact rationals (``2^{-60}`` is not ``2^{-61}``, ``1/2^{1101}`` is not
    ``1/2^{1100}``; ``0.3333333`` is not ``\frac13``); an irrational value against another compares
    at ``P = 60 + d`` digits, ``d`` the digits of both sides' parts (:func:`_exact_digits`), and only
    a clear difference (relative > ``10^{15-P}``) decides (False). Tuples, intervals and matrices compare item by
    item in order; finite sets item by item in any order.
    """
    import sympy

    if not isinstance(gold, sympy.Eq):
        pred = _unwrap_assignment(pred)  # x = 5 against 5 (x = 5 against y = 5 stays unequal)
    if not isinstance(pred, sympy.Eq):
        gold = _unwrap_assignment(gold)
    if isinstance(gold, sympy.MatrixBase) or isinstance(pred, sympy.MatrixBase):
        if not (isinstance(gold, sympy.MatrixBase) and isinstance(pred, sympy.MatrixBase)):
            return None
        if gold.shape != pred.shape:
            return False
        return _all_verdicts([_exact_verdict(g, p) for g, p in zip(gold, pred, strict=True)])
    if isinstance(gold, sympy.Tuple) and isinstance(pred, sympy.Tuple):
        if len(gold) != len(pred):
            return False
        return _all_verdicts([_exact_verdict(g, p) for g, p in zip(gold.args, pred.args, strict=True)])
    if isinstance(gold, sympy.Interval) and isinstance(pred, sympy.Interval):
        if (gold.left_open, gold.right_open) != (pred.left_open, pred.right_open):
            return None  # math-verify's own interval rules decide
        ends = [_exact_verdict(gold.start, pred.start), _exact_verdict(gold.end, pred.end)]
        return False if False in ends else None
    if isinstance(gold, sympy.FiniteSet) and isinstance(pred, sympy.FiniteSet):
        if len(gold) != len(pred):
            return None
        for p in pred.args:
            verdicts = [_exact_verdict(g, p) for g in gold.args]
            if True in verdicts:
                continue
            return False if all(v is False for v in verdicts) else None
        return True
    if isinstance(gold, sympy.Basic) and isinstance(pred, sympy.Basic):
        if isinstance(gold, (sympy.Set, sympy.Tuple)) or isinstance(pred, (sympy.Set, sympy.Tuple)):
            return None
        a, b = _exact_value(gold), _exact_value(pred)
        if a is None or b is None:
            return None
        if a.is_Rational and b.is_Rational:
            return bool(a == b)
        digits = 60 + math.ceil(_exact_digits(a) + _exact_digits(b))  # sqrt2 + 10^{-100} is not sqrt2
        try:
            an, bn = sympy.N(a, digits), sympy.N(b, digits)
            diff, scale = abs(an - bn), max(abs(an), abs(bn))
            if not (diff.is_number and scale.is_number) or diff.has(sympy.nan):
                return None
            if diff > scale * sympy.Float(f"1e-{digits - 15}", digits):
                return False
        except Exception:
            return None
    return None


def _all_verdicts(verdicts: list[bool | None]) -> bool | None:
    if False in verdicts:
        return False
    return True if all(v is True for v in verdicts) else None


def math_verify_fn(extracted: str, golds: list[str]) -> tuple[bool, str]:
    r"""Grade ``extracted`` against each gold with math-verify (its timeouts off; run in a worker).

    Both sides are first normalised (thousands separators, currency, units, percent, scientific
    notation; see ``docs/grading.md``); math-verify then compares them, with inequalities allowed to
    match intervals, and an exact comparison (:func:`_exact_verdict`) overrides it wherever both
    sides are exact numbers (so ``10^{30}`` never equals ``10^{31}`` through floating point).

    Returns:
        ``(correct, reason)``: reason is ``"correct"``, ``"wrong"``, ``"unparsable answer"``,
        ``"unparsable ground truth"`` or ``"correct (string match; ground truth unparsable)"``.

    Raises:
        ImportError: math-verify is not installed (the worker turns any exception into a
            ``"grader error: ..."`` verdict).
    """
    from math_verify import parse

    cache: dict[str, list[Any]] = {}

    def parsed(s: str) -> list[Any]:
        if s not in cache:
            cache[s] = parse("\\boxed{" + s + "}", parsing_timeout=None) if s else []
        return cache[s]

    parsed_any_gold = False
    pred_is_math = False
    pred_parsed = False
    for g in golds:
        pred_s, gold_s = _normalise_pair(extracted, g)
        pred_union, gold_union = _or_relations_set(pred_s, parsed), _or_relations_set(gold_s, parsed)
        if pred_union is not None or gold_union is not None:  # x < 2 or x > 3
            pred_parsed = pred_is_math = parsed_any_gold = True
            gold_set = gold_union if gold_union is not None else _as_set(parsed(gold_s))
            pred_set = pred_union if pred_union is not None else _as_set(parsed(pred_s))
            if _sets_equal(gold_set, pred_set):
                return True, "correct"
            continue
        pred = parsed(pred_s)
        pred_parsed = pred_parsed or bool(pred)
        pred_is_math = pred_is_math or any(not isinstance(p, str) for p in pred)
        gold = parsed(gold_s)
        if not gold:
            continue
        parsed_any_gold = True
        if pred and _agree(gold, pred):
            return True, "correct"
    if not pred_parsed:
        return False, "unparsable answer"
    if not parsed_any_gold:
        if any(_normalise(extracted) == _normalise(g) for g in golds):
            return True, "correct (string match; ground truth unparsable)"
        return False, "unparsable ground truth"
    return False, "wrong" if pred_is_math else "unparsable answer"


def _or_relations_set(s: str, parsed: Callable[[str], list[Any]]) -> Any:
    r"""The union of ``a \\lor b \\lor ...`` where every part is an inequality in one variable, else None."""
    import sympy

    if "\\lor" not in s:
        return None
    parts = [p.strip() for p in s.split("\\lor")]
    sets = []
    symbols: set[Any] = set()
    for part in parts:
        exprs = [e for e in parsed(part) if not isinstance(e, str)]
        if not exprs or not isinstance(exprs[0], (sympy.And, sympy.Rel)) or isinstance(exprs[0], sympy.Eq):
            return None
        symbols |= exprs[0].free_symbols
        if len(symbols) != 1:
            return None
        try:
            sets.append(exprs[0].as_set())
        except Exception:
            return None
    return sympy.Union(*sets)


def _as_set(candidates: list[Any]) -> Any:
    """The first parsed candidate as a sympy set (an inequality becomes its solution set), else None."""
    import sympy

    for e in candidates:
        if isinstance(e, sympy.Set):
            return e
        if isinstance(e, (sympy.And, sympy.Rel)) and not isinstance(e, sympy.Eq) and len(e.free_symbols) == 1:
            try:
                return e.as_set()
            except Exception:
                return None
    return None


def _sets_equal(a: Any, b: Any) -> bool:
    import sympy

    if a is None or b is None:
        return False
    try:
        return bool(a == b or a.symmetric_difference(b) == sympy.S.EmptySet)
    except Exception:
        return False


def _agree(gold: list[Any], pred: list[Any]) -> bool:
    """math-verify's verdict on parsed candidates, overridden by :func:`_exact_verdict` where it decides."""
    from math_verify import verify

    gold_texts = {g.strip() for g in gold if isinstance(g, str)} - {""}
    if any(isinstance(p, str) and p.strip() in gold_texts for p in pred):
        return True  # the same text after normalisation
    for g in gold:
        for p in pred:
            if isinstance(g, str) or isinstance(p, str):
                continue
            exact = _exact_verdict(g, p)
            if exact is not None:
                if exact:
                    return True
                continue
            if verify([g], [p], allow_set_relation_comp=True, timeout_seconds=None):
                return True
    return False


def _normalise(s: str) -> str:
    return "".join(s.split()).rstrip(".")


def _load_fn(path: str) -> VerifyFn:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def _fn_path(fn: VerifyFn | str) -> str:
    if isinstance(fn, str):
        return fn
    return f"{fn.__module__}:{fn.__qualname__}"


def _worker_main(fn_path: str) -> None:
    """Worker loop (``python -c _WORKER_COMMAND module:fn``): JSON lines in, JSON lines out.

    The protocol goes over a private copy of the original stdout; fd 1 is pointed at stderr so a
    grader that prints cannot corrupt it.
    """
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    fn = _load_fn(fn_path)
    if fn_path == _fn_path(math_verify_fn).replace("__main__", "agentenv.envs.python_tool.grading"):
        import math_verify  # noqa: F401  (imported before "ready": startup is not grading time)
    out.write('"ready"\n')
    for line in sys.stdin:
        try:
            extracted, golds = json.loads(line)
            reply = list(fn(extracted, golds))
        except Exception as exc:  # the worker must survive any grader failure
            reply = [False, f"grader error: {type(exc).__name__}: {exc}"]
        out.write(json.dumps(reply) + "\n")


#: The worker's program: imported, not run as ``-m`` (this module is imported by its package's
#: ``__init__`` first, so ``runpy`` would warn on every worker start).
_WORKER_COMMAND = "import sys; from agentenv.envs.python_tool.grading import _worker_main; _worker_main(sys.argv[1])"


#: Least share of the deadline a worker must have spent on CPU for a timeout to be the answer's
#: (graded wrong); below it the worker was stopped or starved, a fault of the grader.
_ANSWER_CPU_SHARE = 0.1

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class _Worker:
    """One grading subprocess and its pipes."""

    def __init__(self, fn_path: str, start_timeout_s: float) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_COMMAND, fn_path],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._buf = b""
        try:
            ready = self.read(start_timeout_s)
        except EOFError:
            ready = None
        if ready != "ready":
            self.kill()
            raise ConfigError(f"grader worker ({fn_path}) did not start within {start_timeout_s} s")

    def send(self, obj: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(obj) + "\n").encode())
        self.proc.stdin.flush()

    def read(self, timeout_s: float) -> Any:
        """One JSON reply; None on timeout; EOFError when the worker died."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise EOFError("grader worker exited")
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return json.loads(line)

    def cpu_s(self) -> float | None:
        """CPU seconds (user + system) the worker has used so far; None where ``/proc`` cannot tell."""
        try:
            with open(f"/proc/{self.proc.pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # utime, stime (fields 14, 15 of stat)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


def _box_group_answer(response_text: str, golds: list[str]) -> tuple[str, list[str]] | None:
    r"""The final box group joined as one list answer, and the golds that are lists/sets; or None.

    Only when the final group (:func:`extract_final_box_group`) has 2+ boxes, each holding one item
    (no top-level comma), and some gold is a bare list (``2, 3``) or a set (``\\{2, 3\\}``): tuples,
    intervals and single values are never matched by several boxes.
    """
    group = extract_final_box_group(response_text)
    if len(group) < 2 or any(_top_level_commas(_normalise_answer(b, plain_commas=True)) for b in group):
        return None
    list_golds = [g for g in golds if _is_list_answer(_normalise_answer(g, plain_commas=True))]
    if not list_golds:
        return None
    return ", ".join(group), list_golds


class Grader:
    """A small pool of grading worker processes; thread-safe.

    Args:
        workers: Most worker processes alive at once (each holds sympy: ~100 MB).
        verify_fn: Importable top-level function (or ``"module:function"``) ``(extracted, golds) ->
            (correct, reason)`` run in the worker; default :func:`math_verify_fn`.
        start_timeout_s: Seconds a new worker may take to import its grader (not counted in any
            grading deadline).

    Raises:
        ConfigError: ``workers < 1``.
    """

    def __init__(
        self, *, workers: int = 1, verify_fn: VerifyFn | str = math_verify_fn, start_timeout_s: float = 120.0
    ):
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self._fn_path = _fn_path(verify_fn)  # a fresh interpreter: no fork of a threaded process
        self._start_timeout_s = start_timeout_s
        self._max = workers
        self._idle: list[_Worker] = []
        self._count = 0
        self._cond = threading.Condition()
        self._closed = False
        self.timeouts = 0  #: deadline kills so far (answers too expensive and stalled workers)
        self.restarts = 0  #: workers started after the first

    def _take(self) -> _Worker:
        """An idle worker, a new one while fewer than ``workers`` exist, else wait for either."""
        with self._cond:
            while True:
                if self._idle:
                    return self._idle.pop()
                if self._count < self._max:
                    self._count += 1
                    break
                self._cond.wait()
        try:
            return _Worker(self._fn_path, self._start_timeout_s)
        except BaseException:
            with self._cond:
                self._count -= 1
                self._cond.notify()
            raise

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
        self._drop(worker)

    def _drop(self, worker: _Worker) -> None:
        """Kill ``worker``; a waiting caller may then start a fresh one."""
        worker.kill()
        with self._cond:
            self._count -= 1
            self.restarts += 1
            self._cond.notify()

    def grade(
        self, response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
    ) -> GradeResult:
        r"""Grade the last ``\\boxed{}`` of ``response_text`` against ``ground_truth``.

        Args:
            response_text: The model's final reply.
            ground_truth: One answer, or several accepted alternatives.
            timeout_s: Seconds the grading itself may take; past it the worker is killed. When the
                worker spent the time computing (at least :data:`_ANSWER_CPU_SHARE` of it on CPU),
                the answer is graded wrong with reason ``"timeout after N s"`` and ``timed_out``;
                otherwise the result carries ``fault="timeout"`` (the grader stalled).

        Returns:
            A :class:`GradeResult`; no answer text makes it raise (a hang, a crash or a grader
            exception is a wrong verdict with its reason, or a ``fault`` for the caller to handle).

        Raises:
            ConfigError: A new worker process did not start within ``start_timeout_s``.
        """
        extracted = extract_last_boxed(response_text)
        if extracted is None:
            return GradeResult(False, None, "no \\boxed{} answer")
        golds = _golds(ground_truth)
        if not golds:
            return GradeResult(False, extracted, "empty ground truth")
        if self._closed:
            return GradeResult(False, extracted, "grader closed")
        tries = [(extracted, golds, "")]
        group = _box_group_answer(response_text, golds)
        if group is not None:
            tries.append((*group, " (several boxes read as one set)"))
        worker = self._take()
        t0 = time.perf_counter()
        deadline = time.monotonic() + timeout_s
        verdict: tuple[bool, str] = (False, "wrong")
        for answer, try_golds, note in tries:
            try:
                cpu0 = worker.cpu_s()
                worker.send([answer, try_golds])
                reply = worker.read(max(0.0, deadline - time.monotonic()))
                if reply is None:
                    return self._timed_out(worker, extracted, timeout_s, cpu0, t0)
                correct, reason = reply
            except (EOFError, OSError, BrokenPipeError) as exc:
                self._drop(worker)
                FAULTS.record("grader_crashes", time.perf_counter() - t0)
                return GradeResult(
                    False, extracted, f"grader crashed: {type(exc).__name__}", time.perf_counter() - t0, "crashed"
                )
            if correct:
                self._give_back(worker)
                return GradeResult(True, answer, str(reason) + note, time.perf_counter() - t0)
            if not note:
                verdict = (False, str(reason))
        self._give_back(worker)
        return GradeResult(False, extracted, verdict[1], time.perf_counter() - t0)

    def _timed_out(self, worker: _Worker, extracted: str, timeout_s: float, cpu0: float | None,
                   t0: float) -> GradeResult:
        """Kill ``worker`` past its deadline; the answer's timeout if it was computing, else a fault."""
        cpu1 = worker.cpu_s()
        used = None if cpu0 is None or cpu1 is None else cpu1 - cpu0
        self.timeouts += 1
        self._drop(worker)
        duration = time.perf_counter() - t0
        if used is None or used >= _ANSWER_CPU_SHARE * timeout_s:
            return GradeResult(False, extracted, f"timeout after {timeout_s:g} s", duration, timed_out=True)
        FAULTS.record("grader_kills", duration)  # from the stalled request to the kill
        return GradeResult(False, extracted, f"grader stalled: {used:.2f} s of CPU in the {timeout_s:g} s deadline",
                           duration, "timeout")

    async def grade_async(
        self, response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
    ) -> GradeResult:
        """:meth:`grade` without blocking the event loop (runs in a thread).

        Raises:
            ConfigError: A new worker process did not start within ``start_timeout_s``.
        """
        return await asyncio.to_thread(self.grade, response_text, ground_truth, timeout_s=timeout_s)

    def close(self) -> None:
        """Kill every idle worker now and busy ones when they finish. Safe to call twice."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
        for w in idle:
            w.kill()

    def __enter__(self) -> Grader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default: Grader | None = None
_default_lock = threading.Lock()


def default_grader() -> Grader:
    """The process-wide :class:`Grader` (2 workers), started on first use and closed at exit.

    Raises:
        Nothing: workers start lazily, on the first grade.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = Grader(workers=2)
            atexit.register(_default.close)
        return _default


def grade_answer(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    r"""Grade ``response_text``'s last ``\\boxed{}`` with the default grader (see :meth:`Grader.grade`).

    Raises:
        ConfigError: A new worker process did not start within its start timeout.
    """
    return default_grader().grade(response_text, ground_truth, timeout_s=timeout_s)


async def grade_answer_async(
    response_text: str, ground_truth: str | int | float | Sequence[str], *, timeout_s: float = 5.0
) -> GradeResult:
    """Async :func:`grade_answer`; safe inside a running event loop.

    Raises:
        ConfigError: A new worker process did not start within its start timeout.
    """
    return await default_grader().grade_async(response_text, ground_truth, timeout_s=timeout_s)

