"""Overhead of the agents' OpenAI-compatible endpoint per request, against a direct engine call.

Sessions of the endpoint (``agentenv.agents.AgentEndpoint``) are driven by the real ``openai``
client (``AsyncOpenAI``), each a multi-turn chat (the reply and a new user message appended every
turn, so each request extends the token row). Every request's engine time is measured inside the
endpoint (a timing wrapper around the engine's ``generate``); the endpoint's *overhead* is the
request's wall time seen by the client minus that engine time: HTTP, JSON, validation, the
template's delta rendering, tokenization, tool-call parsing, the trajectory record, and for
``stream=true`` the server-sent events and the client reading them to ``[DONE]``. Plain and streamed
requests are measured in the same run. The direct engine call is the same engine on the same prompts
at the same concurrency, for scale.

The policy is a tiny random Llama over SmolLM2's tokenizer (tests/agents/tiny.py), so the engine is
fast and the overhead shows. Run: ``.venv/bin/python benchmarks/bench_endpoint.py`` (about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class TimedEngine:
    """Delegates to an engine; records each ``generate``'s wall time (seconds) per prompt length."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.times: list[float] = []
        self.prompts: list[list[int]] = []

    @property
    def version(self) -> int:
        return self.engine.version

    @property
    def max_context_tokens(self) -> int:
        return self.engine.max_context_tokens

    async def generate(self, prompt_ids, params):
        t0 = time.perf_counter()
        out = await self.engine.generate(prompt_ids, params)
        self.times.append(time.perf_counter() - t0)
        self.prompts.append(list(prompt_ids))
        return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def ask(client, msgs: list[dict], stream: bool) -> dict:
    """One request; the reply's message as the agent appends it (a stream's deltas joined)."""
    if not stream:
        r = await client.chat.completions.create(model="agentenv-policy", messages=msgs, max_tokens=8)
        return r.choices[0].message.model_dump(exclude_none=True)
    chunks = await client.chat.completions.create(model="agentenv-policy", messages=msgs, max_tokens=8, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    return {"role": "assistant", "content": text}


async def endpoint_run(engine, renderer, cfg, sessions: int, turns: int,
                       stream: bool = False) -> tuple[list[float], list[float], list]:
    import openai

    from agentenv.agents import AgentEndpoint
    from agentenv.rollout.tool_calls import get_tool_parser

    timed = TimedEngine(engine)
    endpoint = AgentEndpoint(timed, renderer)
    await endpoint.start()
    overhead: list[float] = []
    wall: list[float] = []

    async def one(k: int) -> None:
        s = endpoint.open_session(cfg, get_tool_parser("hermes"))
        client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=s.id, max_retries=0)
        msgs = [{"role": "user", "content": f"Task {k}: what is {k} + 2?"}]
        for _ in range(turns):
            n = len(timed.times)
            t0 = time.perf_counter()
            reply = await ask(client, msgs, stream)
            dt = time.perf_counter() - t0
            # this request's engine call: the one whose prompt is this agent conversation's row
            i = next(j for j in range(n, len(timed.times)) if timed.prompts[j] == s.log[-1][0])
            wall.append(dt)
            overhead.append(dt - timed.times[i])
            msgs += [reply, {"role": "user", "content": "Go on."}]
        await client.close()
        endpoint.close_session(s.id)

    await asyncio.gather(*(one(k) for k in range(sessions)))
    await endpoint.close()
    return overhead, wall, list(zip(timed.prompts, strict=False))


async def direct_run(engine, prompts: list[list[int]], sessions: int, params) -> list[float]:
    times: list[float] = []
    queue = list(prompts)

    async def worker() -> None:
        while queue:
            p = queue.pop()
            t0 = time.perf_counter()
            await engine.generate(p, params)
            times.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(sessions)))
    return times


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=4, help="requests per session")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    import torch

    from agentenv.engines.base import SamplingParams
    from agentenv.engines.transformers_engine import TransformersEngine
    from agentenv.rollout.episode import RolloutConfig
    from tests.agents.tiny import tiny_smollm_lm, tool_renderer
    from tests.smollm_tokenizer import smollm_tokenizer

    torch.set_num_threads(1)
    renderer = tool_renderer()
    cfg = RolloutConfig(max_turns=64, max_new_tokens_per_turn=8, max_total_tokens=1024)
    results = {}
    for sessions, stream in ((1, False), (1, True), (32, False), (32, True)):
        engine = TransformersEngine(tiny_smollm_lm(), smollm_tokenizer(), max_batch_size=32, seed=0)
        await endpoint_run(engine, renderer, cfg, min(sessions, 2), 1, stream)  # warm-up
        turns = args.turns * (5 if sessions == 1 else 1)
        overhead, wall, calls = await endpoint_run(engine, renderer, cfg, sessions, turns, stream)
        params = SamplingParams(max_new_tokens=8, stop_token_ids=tuple(renderer.stop_token_ids))
        direct = await direct_run(engine, [p for (p,) in calls], sessions, params)
        await engine.close()
        key = f"{sessions} sessions, {'stream' if stream else 'plain'}"
        results[key] = {
            "requests": len(overhead),
            "overhead_ms_median": 1e3 * statistics.median(overhead), "overhead_ms_p95": 1e3 * pct(overhead, 0.95),
            "request_ms_median": 1e3 * statistics.median(wall), "request_ms_p95": 1e3 * pct(wall, 0.95),
            "direct_engine_ms_median": 1e3 * statistics.median(direct),
            "direct_engine_ms_p95": 1e3 * pct(direct, 0.95),
        }
        r = results[key]
        print(f"{key}, {r['requests']} requests: endpoint overhead median "
              f"{r['overhead_ms_median']:.2f} ms, p95 {r['overhead_ms_p95']:.2f} ms; request median "
              f"{r['request_ms_median']:.2f} ms, p95 {r['request_ms_p95']:.2f} ms; direct engine call median "
              f"{r['direct_engine_ms_median']:.2f} ms, p95 {r['direct_engine_ms_p95']:.2f} ms")
    machine = f"{platform.machine()}, {__import__('os').cpu_count()} CPUs, Python {platform.python_version()}"
    print(f"machine: {machine}")
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "results": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
