r"""The grading table: answer kinds math-verify alone gets wrong, graded through the real worker.

Each case is ``(reply text, reference answers, expected verdict, kind)``. The references are taken
from (or shaped like) the MATH train/test answers; the replies are what a model writes. The rules
behind the verdicts are in docs/grading.md. Cases marked "math-verify alone: wrong verdict" in a
comment are ones plain ``math_verify.verify`` (0.9) decides the other way.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agentenv.envs.python_tool.grading import Grader

# (reply text, reference answers, expected verdict, kind)
CASES: list[tuple[str, str | list[str], bool, str]] = [
    # --- exactness: tiny/huge values, no float tolerance ---------------------------------------
    ("so $p = \\boxed{2^{-61}}$", "2^{-60}", False, "exact"),  # math-verify alone: True (evalf chop)
    ("\\boxed{\\frac{1}{2^{60}}}", "\\frac{1}{2^{60}+1}", False, "exact"),  # math-verify alone: True
    ("\\boxed{3^{-40}+3^{-80}}", "3^{-40}", False, "exact"),  # math-verify alone: True
    ("\\boxed{0.000000002}", "10^{-9}", False, "exact"),  # math-verify alone: True (6-place rounding)
    ("\\boxed{10^{31}}", "10^{30}", False, "exact"),
    ("\\boxed{101!}", "100!", False, "exact"),
    ("\\boxed{2e-20}", "1e-20", False, "exact"),
    ("\\boxed{1e-20}", "10^{-20}", True, "exact"),  # math-verify alone: False (reads 1e-20 as e - 20)
    ("\\boxed{2.5e-3}", "\\frac{1}{400}", True, "exact"),  # math-verify alone: False
    ("\\boxed{1267650600228229401496703205376}", "2^{100}", True, "exact"),
    ("\\boxed{2^{4951}}", "2^{4950}", False, "exact"),
    ("\\boxed{-562949953421312}", "-2^{49}", True, "exact"),
    ("\\boxed{0.3333333}", "\\frac{1}{3}", False, "exact"),  # math-verify alone: True
    ("\\boxed{2.7182818}", "e", False, "exact"),  # math-verify alone: True
    ("\\boxed{0.8660254}", "\\frac{\\sqrt{3}}{2}", False, "exact"),  # math-verify alone: True
    ("\\boxed{(3, 1.5707963)}", "\\left( 3, \\frac{\\pi}{2} \\right)", False, "exact"),  # alone: True
    # --- exactness past float range: reciprocals, negative exponents, ratios of huge numbers -------
    ("\\boxed{1/2^{1101}}", "1/2^{1100}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{1}{2^{1101}}}", "\\frac{1}{2^{1100}}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{1}{2^{1100}}}", "2^{-1100}", True, "exact"),
    ("\\boxed{2^{-1101}}", "2^{-1100}", False, "exact"),  # math-verify alone: True
    ("\\boxed{1/10^{401}}", "1/10^{400}", False, "exact"),  # math-verify alone: True
    ("\\boxed{10^{-400}}", "\\frac{1}{10^{400}}", True, "exact"),
    ("\\boxed{0.1^{500}}", "10^{-500}", True, "exact"),
    ("\\boxed{0.5^{1101}}", "0.5^{1100}", False, "exact"),  # math-verify alone: True
    ("\\boxed{(1/2)^{1101}}", "(1/2)^{1100}", False, "exact"),  # math-verify alone: True
    ("\\boxed{1/171!}", "1/170!", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{1}{171!}}", "\\frac{1}{171!}", True, "exact"),
    ("\\boxed{171!/170!}", "171", True, "exact"),
    ("\\boxed{-\\frac{1}{2^{1100}}}", "\\frac{1}{2^{1100}}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{2^{2000}}{3^{1300}}}", "\\frac{2^{2000}+1}{3^{1300}}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{10^{400}}{10^{401}}}", "\\frac{1}{10}", True, "exact"),
    ("\\boxed{\\frac{10^{400}+1}{10^{401}}}", "\\frac{1}{10}", False, "exact"),
    ("\\boxed{\\frac{3^{1000}}{3^{999}}}", "3", True, "exact"),
    ("\\boxed{\\binom{1000}{500}/\\binom{1000}{499}}", "\\frac{501}{500}", True, "exact"),
    ("\\boxed{\\binom{1000}{500}/\\binom{1000}{499}}", "\\frac{500}{501}", False, "exact"),
    ("\\boxed{\\frac{1}{3^{700}}}", "3^{-700}", True, "exact"),
    ("\\boxed{\\frac{1}{3^{701}}}", "3^{-700}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\frac{1}{\\sqrt{10^{801}}}}", "\\frac{1}{\\sqrt{10^{800}}}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\sqrt{2}/10^{401}}", "\\sqrt{2}/10^{400}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\sqrt{2}\\cdot 10^{-400}}", "\\frac{\\sqrt{2}}{10^{400}}", True, "exact"),
    ("\\boxed{\\sqrt{2}+10^{-100}}", "\\sqrt{2}", False, "exact"),  # math-verify alone: True
    ("\\boxed{\\pi+10^{-50}}", "\\pi", False, "exact"),  # math-verify alone: True
    ("\\boxed{e^{-1001}}", "e^{-1000}", False, "exact"),  # math-verify alone: True
    ("\\boxed{2^{20001}}", "2^{20000}", False, "exact"),
    # --- several boxes read as one set -----------------------------------------------------------
    ("The roots are $x = \\boxed{2}$ and $x = \\boxed{3}$.", "2, 3", True, "boxes"),  # alone: False
    ("\\boxed{5} \\quad \\boxed{3}", "\\{3,5\\}", True, "boxes"),  # alone: False
    ("\\boxed{1}, \\boxed{-2}", "1,-2", True, "boxes"),  # math-verify alone: False
    ("Values: \\boxed{3}, \\boxed{5}, \\boxed{7}", "3, 5, 7", True, "boxes"),  # math-verify alone: False
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "2, 3", False, "boxes"),  # a superset is wrong
    ("\\boxed{2} and \\boxed{4}", "2, 3", False, "boxes"),
    ("\\boxed{1} \\boxed{2}", "(1,2)", False, "boxes"),  # a tuple is never matched by several boxes
    (
        "First $f(x) = \\boxed{x^2-5x+6}$, which we now factor step by step to find where it vanishes:"
        " $(x-2)(x-3)=0$, so $x=\\boxed{2}$ or $x=\\boxed{3}$",
        "2, 3",
        True,
        "boxes",
    ),  # math-verify alone: False
    (
        "Try \\boxed{2}. That fails the original equation once we substitute it back in and simplify"
        " both sides carefully, so the answer is \\boxed{3}",
        "2, 3",
        False,
        "boxes",
    ),  # boxes far apart are not one group: only the last box counts
    ("first \\boxed{2} then \\boxed{3}", "3", True, "boxes"),  # a single reference: last box as before
    ("first \\boxed{3} then \\boxed{2}", "3", False, "boxes"),
    # --- thousands separators --------------------------------------------------------------------
    ("\\boxed{1\\,000}", "1000", True, "separators"),  # math-verify alone: False (reads 0 * 1)
    ("\\boxed{1\\,000}", "0", False, "separators"),  # math-verify alone: True
    ("\\boxed{1{,}000}", "1000", True, "separators"),
    ("\\boxed{1\\!000}", "1000", True, "separators"),
    ("\\boxed{10,\\!000}", "10000", True, "separators"),
    ("\\boxed{1,000}", "1000", True, "separators"),
    ("\\boxed{10080}", "10,\\!080", True, "separators"),
    ("\\boxed{1\\ 000\\ 000}", "10^6", True, "separators"),  # math-verify alone: False
    ("\\boxed{\\frac{1}{29322216}}", "\\dfrac{1}{29,\\!322,\\!216}", True, "separators"),  # alone: False
    ("\\boxed{11,111,111,100}", "11,\\! 111,\\! 111,\\! 100", True, "separators"),
    ("\\boxed{1,2}", "(1,2)", True, "separators"),  # a pair, in order
    ("\\boxed{12}", "(1,2)", False, "separators"),
    ("\\boxed{2,1}", "(1,2)", False, "separators"),
    ("\\boxed{1,200}", "(1,200)", True, "separators"),  # math-verify alone: False (reads 1200)
    ("\\boxed{1200}", "(1,200)", False, "separators"),
    # --- currency, units, percent ----------------------------------------------------------------
    ("\\boxed{\\$5.00}", "5", True, "units"),
    ("\\boxed{\\text{5 cm}}", "5", True, "units"),  # math-verify alone: False (a symbol "5cm")
    ("\\boxed{\\text{5 cm}}", "6", False, "units"),
    ("\\boxed{5\\ \\text{cm}^2}", "5", True, "units"),
    ("\\boxed{32348}", "\\$32,\\!348", True, "units"),
    ("\\boxed{864 \\text{ square inches}}", "864 \\mbox{ inches}^2", True, "units"),
    ("\\boxed{\\frac{270}{7}}", "\\frac{270}7\\text{ degrees}", True, "units"),
    ("\\boxed{5.4}", "5.4 \\text{ cents}", True, "units"),
    ("\\boxed{6, 8, 10}", "6, 8\\text{, and }10", True, "units"),  # math-verify alone: False
    ("\\boxed{50\\%}", "50", True, "units"),
    ("\\boxed{50}", "50\\%", True, "units"),
    ("\\boxed{0.5}", "50\\%", False, "units"),  # percent is a label, not 1/100; alone: True
    ("\\boxed{17}", "0.17", False, "units"),
    ("\\boxed{90^\\circ}", "\\frac{\\pi}{2}", False, "units"),  # degrees are not converted
    # --- inequalities against intervals -----------------------------------------------------------
    ("\\boxed{x > 3}", "(3, \\infty)", True, "intervals"),  # math-verify alone: False
    ("\\boxed{-2 \\le x < 5}", "[-2, 5)", True, "intervals"),  # math-verify alone: False
    ("\\boxed{x \\le 0}", "(-\\infty, 0]", True, "intervals"),  # math-verify alone: False
    ("\\boxed{x \\ge 3}", "(3,\\infty)", False, "intervals"),
    ("\\boxed{-2 < x < 5}", "[-2,5)", False, "intervals"),
    ("\\boxed{x < 2 \\text{ or } x > 3}", "(-\\infty, 2) \\cup (3, \\infty)", True, "intervals"),  # alone: False
    ("\\boxed{x < 2 \\text{ or } x > 4}", "(-\\infty, 2) \\cup (3, \\infty)", False, "intervals"),
    ("\\boxed{(3, \\infty)}", "x > 3", True, "intervals"),
    # --- ordinary forms ---------------------------------------------------------------------------
    ("\\boxed{\\frac{1}{2}}", "0.5", True, "ordinary"),
    ("\\boxed{\\dfrac{7}{3}}", "\\frac73", True, "ordinary"),
    ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt2}{2}", True, "ordinary"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{\\sqrt2}{2}", True, "ordinary"),
    ("\\boxed{3.14}", "\\pi", False, "ordinary"),
    ("\\boxed{\\frac{\\pi}{2}}", "\\frac12\\pi", True, "ordinary"),
    ("\\boxed{(2,1)}", "(1,2)", False, "ordinary"),
    (
        "\\boxed{\\begin{pmatrix} -3 \\\\ 4 \\end{pmatrix}}",
        "\\begin{pmatrix} 4 \\\\ -3 \\end{pmatrix}",
        False,
        "ordinary",
    ),
    (
        "\\boxed{\\begin{pmatrix} 0.5 & 1 \\\\ 0 & 1 \\end{pmatrix}}",
        "\\begin{pmatrix} \\frac{1}{2} & 1 \\\\ 0 & 1 \\end{pmatrix}",
        True,
        "ordinary",
    ),
    ("\\boxed{x = 5}", "5", True, "ordinary"),
    ("\\boxed{-2, 1+\\sqrt5, 1-\\sqrt5}", "\\{1\\pm\\sqrt{5},-2\\}", True, "ordinary"),
    ("\\boxed{1.5}", ["$\\frac{3}{2}$"], True, "ordinary"),
    ("\\boxed{0.\\overline{3}}", "\\frac{1}{3}", True, "exact"),  # math-verify alone: False (unparsable)
    ("\\boxed{\\frac{1}{6}}", "0.1\\overline{6}", True, "exact"),  # math-verify alone: False
    ("\\boxed{0.\\overline{3}}", "0.33", False, "exact"),
]


@pytest.fixture(scope="module")
def grader() -> Iterator[Grader]:
    with Grader(workers=1) as g:
        yield g


def _case_id(case: tuple[str, str | list[str], bool, str]) -> str:
    reply, gold, expected, kind = case
    return f"{kind}-{'right' if expected else 'wrong'}-{reply[-40:]!r}-vs-{gold!r}"


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 100
    assert {kind for *_, kind in CASES} == {"exact", "boxes", "separators", "units", "intervals", "ordinary"}


@pytest.mark.parametrize(("reply", "gold", "expected", "kind"), CASES, ids=[_case_id(c) for c in CASES])
def test_grading_table(grader: Grader, reply: str, gold: str | list[str], expected: bool, kind: str) -> None:
    r = grader.grade(reply, gold, timeout_s=60)
    assert not r.reason.startswith(("timeout", "grader")), r
    assert r.correct is expected, f"{kind}: {reply!r} vs {gold!r} -> {r}"
