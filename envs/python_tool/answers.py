r"""Final answers: which ``\\boxed{}`` a reply's answer is, and whether it equals the reference.

* the *last* ``\\boxed{...}`` (or ``\\fbox{...}``) is the answer, found with a brace-matching scan;
  only when it is wrong, the reference is a list or set and the reply ends with a group of one-item
  boxes (``\\boxed{2}`` and ``\\boxed{3}``) is that group read as one set
  (:func:`extract_final_box_group`);
* both sides are normalised before math-verify (thousands separators, currency, units, percent,
  scientific notation, repeating decimals), inequalities may match intervals, and an exact sympy
  comparison overrides math-verify's float tolerance wherever both sides are exact numbers
  (:func:`math_verify_fn`). The rules, and the misses still known, are in ``docs/grading.md``.

math-verify's own timeouts use ``signal.alarm`` and with them off a pathological answer can hang the
caller: :func:`math_verify_fn` is meant to run in a worker process that a deadline can kill
(:mod:`agentenv.envs.python_tool.grading`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_LOG10_2 = math.log10(2)


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

def top_level_commas(s: str) -> int:
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


def normalise_answer(s: str, *, plain_commas: bool) -> str:
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


def is_list_answer(s: str) -> bool:
    r"""True when ``s`` (normalised) is a bare list ``2, 3`` or a set ``\\{2, 3\\}`` of 2+ items."""
    s = s.strip()
    for left, right in (("\\left\\{", "\\right\\}"), ("\\{", "\\}")):
        if s.startswith(left) and s.endswith(right):
            inner = s[len(left) : -len(right)]
            return top_level_commas(inner) >= 1 and "\\{" not in inner
    return top_level_commas(s) >= 1


def _normalise_pair(extracted: str, gold: str) -> tuple[str, str]:
    """Both sides normalised; plain-comma thousands only on a side whose partner has no comma at all."""
    pred_list = "," in normalise_answer(extracted, plain_commas=False)
    gold_list = "," in normalise_answer(gold, plain_commas=False)
    return (
        normalise_answer(extracted, plain_commas=not gold_list),
        normalise_answer(gold, plain_commas=not pred_list),
    )


def gold_answers(ground_truth: str | int | float | Sequence[str]) -> list[str]:
    """The reference answers as strings: one per item (``$...$`` stripped, empty ones dropped)."""
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
