"""Tool-call parser throughput per model family: 10,000 replies each.

Each family's replies are written in the exact form its chat template or library renders (the
forms ``tests/test_tool_formats.py`` checks against the real renderers), mixed as a policy's replies
are: 50% one call, 10% two calls, 25% a plain answer, 15% malformed (the call's JSON loses its
closing bracket). Replies differ
(the code and numbers change with the index), reasoning blocks are included where the family has
them. Per family: replies per second and microseconds per reply (median of ``--repeats`` passes),
characters per second, and the calls/errors found (a check that the parser read what was meant).

    .venv/bin/python benchmarks/bench_parsers.py [--replies 10000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

from agentenv.rollout.tool_calls import _scan_json_object, get_tool_parser

Call = tuple[str, dict]


def _calls(i: int, n: int) -> list[Call]:
    code = f"import math\nx = sum(math.comb({10 + i % 7}, k) for k in range({i % 11}))\nprint(x, '{{}}')"
    return [("python", {"code": code})] if n == 1 else [("python", {"code": code}), ("search", {"query": f"q{i}"})]


def _hermes(calls: list[Call], think: str) -> str:
    blocks = "\n".join(f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in calls)
    return f"{think}Let me compute this.\n{blocks}"


def _qwen3(calls, i):
    return _hermes(calls, f"<think>\nStep {i}: compute with Python.\n</think>\n\n")


def _llama(calls, i):
    return "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)


def _mistral(calls, i):
    return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a, "id": f"c{i:08d}"} for n, a in calls])


def _harmony(calls, i):
    head = f"<|channel|>analysis<|message|>Step {i}: use the tool.<|end|>"
    return head + "".join(
        f"<|start|>assistant<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>{json.dumps(a)}<|call|>"
        for n, a in calls)


def _deepseek(calls, i):
    body = "\n".join(f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{json.dumps(a)}\n```<｜tool▁call▁end｜>"
                     for n, a in calls)
    return f"<think>\nStep {i}.\n</think>\n\n<｜tool▁calls▁begin｜>{body}<｜tool▁calls▁end｜>"


FAMILIES: dict[str, tuple[str, Callable[[list[Call], int], str], Callable[[int], str]]] = {
    # name: (parser, reply with calls, plain answer)
    "hermes": ("hermes", lambda c, i: _hermes(c, ""), lambda i: f"The answer is \\boxed{{{i}}}."),
    "qwen3": ("qwen3", _qwen3, lambda i: f"<think>\nDone {i}.\n</think>\n\nThe answer is \\boxed{{{i}}}."),
    "llama3_json": ("llama3_json", _llama, lambda i: f"The answer is \\boxed{{{i}}}."),
    "mistral": ("mistral", _mistral, lambda i: f"The answer is \\boxed{{{i}}}."),
    "harmony": ("harmony", _harmony,
                lambda i: f"<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final"
                          f"<|message|>The answer is \\boxed{{{i}}}."),
    "deepseek": ("deepseek", _deepseek, lambda i: f"<think>\nDone {i}.\n</think>\n\nThe answer is \\boxed{{{i}}}."),
}


def replies(family: str, n: int) -> tuple[list[str], int, int]:
    """``n`` replies of ``family`` and the calls and errors they hold."""
    _, with_calls, answer = FAMILIES[family]
    out, calls, errors = [], 0, 0
    for i in range(n):
        kind = i % 20
        if kind < 10:
            out.append(with_calls(_calls(i, 1), i))
            calls += 1
        elif kind < 12:
            out.append(with_calls(_calls(i, 2), i))
            calls += 2
        elif kind < 17:
            out.append(answer(i))
        else:  # malformed: the first call's JSON (object, or Mistral's list) loses its closing bracket
            good = with_calls(_calls(i, 1), i)
            start = good.find('{"')
            start -= good[start - 1] == "["
            end = _scan_json_object(good, start)
            assert end is not None
            out.append(good[: end - 1] + good[end:])
            errors += 1
    return out, calls, errors


def bench(family: str, n: int, repeats: int) -> dict:
    texts, want_calls, want_errors = replies(family, n)
    parser = get_tool_parser(FAMILIES[family][0])
    got_calls = sum(len(parser.parse(t).calls) for t in texts)
    got_errors = sum(len(parser.parse(t).errors) for t in texts)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for t in texts:
            parser.parse(t)
        seconds.append(time.perf_counter() - t0)
    s = statistics.median(seconds)
    chars = sum(map(len, texts))
    return {"family": family, "replies": n, "seconds": round(s, 4), "replies_per_s": round(n / s),
            "us_per_reply": round(1e6 * s / n, 2), "mchars_per_s": round(chars / s / 1e6, 2),
            "calls": got_calls, "calls_expected": want_calls, "errors": got_errors, "errors_expected": want_errors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replies", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{args.replies} replies per family, median of {args.repeats}")
    print(f"{'family':12} {'replies/s':>10} {'us/reply':>9} {'Mchar/s':>8} {'calls':>12} {'errors':>11}")
    for family in FAMILIES:
        r = bench(family, args.replies, args.repeats)
        print(f"{family:12} {r['replies_per_s']:>10} {r['us_per_reply']:>9} {r['mchars_per_s']:>8} "
              f"{r['calls']:>5}/{r['calls_expected']:<6} {r['errors']:>5}/{r['errors_expected']:<5}")


if __name__ == "__main__":
    main()
