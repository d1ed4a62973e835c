"""Peers' adapters: each adapter's step against the wrapped environment's own step.

For every adapter, two instances play the same games (same seeds, same actions): the peer's env
driven directly (its own synchronous ``step``, plus ``get_observation`` for TextArena, which is how
a TextArena user reads the next observation) and the agentenv adapter (``await env.step``). Their
steps alternate one by one, so machine load hits both alike; resets are not timed. Per-step
latency: median and p95 (microseconds); the overhead is adapter minus direct, per statistic.

Cases: ``gym`` (a Gymnasium env with Text spaces, built by ``gymnasium.make``; the adapter inline
and in a worker thread, its default), ``gem`` (GEM ``game:GuessTheNumber-v0-hard-no-max-turn``),
``textarena`` (``GuessTheNumber-v0-hardcore``), ``reasoning_gym`` (``lcm``: the one step is
answer extraction plus the family's verifier), ``skyrl_gym`` (``gsm8k_multi_turn``: SkyRL's grader of a
well-formed wrong answer and its next message; the adapter runs SkyRL's step in a worker thread),
``openenv`` (an echo server under OpenEnv's own ``create_app``, started from .venv-openenv; the direct
side is a raw WebSocket session sending the same step messages: the protocol's round trip), ``verifiers``
(a verifiers ToolEnv in .venv-verifiers; per whole episode, not per step: verifiers' own rollout as
its runner times it against the episode through the adapter).

    .venv/bin/python benchmarks/bench_adapters.py [--episodes 200] [--steps 6] [--deadline-s 120] [--only CASE ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium  # noqa: E402

import agentenv  # noqa: E402
from agentenv.core import text_space  # noqa: E402


def quantiles(xs: list[float]) -> tuple[float, float]:
    """Median and p95 (nearest rank) of ``xs``."""
    xs = sorted(xs)
    return statistics.median(xs), xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]


class EchoEnv(gymnasium.Env):
    """A Gymnasium env with Text spaces whose episode never ends by itself (``"wrong"`` each step)."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = text_space(64)
        self.action_space = text_space(64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "say the word", {}

    def step(self, action):
        return "wrong", 0.0, False, False, {}


def wrong_guesses(secret: int, high: int, n: int, rng: random.Random) -> list[str]:
    return [str(g) for g in rng.sample([g for g in range(1, high + 1) if g != secret], n)]


async def case_gym(args, in_thread: bool) -> tuple[list[float], list[float]]:
    gid = "bench/Echo-v0"
    if gid not in gymnasium.registry:
        gymnasium.register(gid, entry_point=EchoEnv, max_episode_steps=10_000)
    direct, env = gymnasium.make(gid), agentenv.make(f"gym/{gid}", in_thread=in_thread)
    d, a = [], []
    for ep in range(args.episodes):
        direct.reset(seed=ep)
        await env.reset(seed=ep)
        for _ in range(args.steps):
            t = time.perf_counter()
            direct.step("guess")
            d.append(time.perf_counter() - t)
            t = time.perf_counter()
            await env.step("guess")
            a.append(time.perf_counter() - t)
    await env.close()
    return d, a


async def case_gem(args) -> tuple[list[float], list[float]]:
    import gem

    game = "game:GuessTheNumber-v0-hard-no-max-turn"  # 1..50, 50 turns
    direct, env = gem.make(game), agentenv.make(f"gem/{game}")
    rng = random.Random(0)
    d, a = [], []
    for ep in range(args.episodes):
        direct.reset(seed=ep)
        await env.reset(seed=ep)
        secrets = (direct.game_number, env.gem_env.game_number)
        guesses = [g for g in wrong_guesses(secrets[0], 50, args.steps + 1, rng) if int(g) != secrets[1]]
        for g in guesses[: args.steps]:
            action = f"\\boxed{{{g}}}"
            t = time.perf_counter()
            direct.step(action)
            d.append(time.perf_counter() - t)
            t = time.perf_counter()
            await env.step(action)
            a.append(time.perf_counter() - t)
    return d, a


async def case_textarena(args) -> tuple[list[float], list[float]]:
    import textarena as ta

    game = "GuessTheNumber-v0-hardcore"  # 1..50, 10 turns
    env = agentenv.make(f"textarena/{game}")
    rng = random.Random(0)
    d, a = [], []
    for ep in range(args.episodes):
        direct = ta.make(game)
        direct.reset(num_players=1, seed=ep)
        direct.get_observation()
        await env.reset(options={"task": ep})
        secrets = (direct.game_number, env.ta_env.game_number)
        guesses = [g for g in wrong_guesses(secrets[0], 50, args.steps + 1, rng) if int(g) != secrets[1]]
        for g in guesses[: min(args.steps, 8)]:
            action = f"[{g}]"
            t = time.perf_counter()
            direct.step(action)
            direct.get_observation()
            d.append(time.perf_counter() - t)
            t = time.perf_counter()
            await env.step(action)
            a.append(time.perf_counter() - t)
    return d, a


async def case_reasoning_gym(args) -> tuple[list[float], list[float]]:
    import reasoning_gym
    from reasoning_gym.utils import extract_answer

    n = args.episodes * args.steps
    data = reasoning_gym.create_dataset("lcm", seed=0, size=n)
    env = agentenv.make("reasoning_gym/lcm", seed=0, size=n)
    d, a = [], []
    for i in range(n):
        entry = data[i]
        reply = f"Thinking... <answer>{entry['answer']}</answer>"
        await env.reset(options={"task": i})
        t = time.perf_counter()
        data.score_answer(extract_answer(reply), entry)
        d.append(time.perf_counter() - t)
        t = time.perf_counter()
        await env.step(reply)
        a.append(time.perf_counter() - t)
    return d, a


async def case_skyrl_gym(args) -> tuple[list[float], list[float]]:
    import tempfile

    import skyrl_gym
    from omegaconf import OmegaConf

    rows = [{"env_class": "gsm8k_multi_turn", "prompt": [{"role": "user", "content": f"What is {i} + 1?"}],
             "reward_spec": {"method": "rule", "ground_truth": str(i + 1)}, "extra_info": {"max_turns": args.steps + 1}}
            for i in range(args.episodes)]
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        env = agentenv.make("skyrl_gym/gsm8k_multi_turn", data=str(data))
        d, a = [], []
        for ep, row in enumerate(rows):
            direct = skyrl_gym.make("gsm8k_multi_turn", env_config=OmegaConf.create({}),
                                    extras={k: v for k, v in row.items() if k not in ("prompt", "env_class")})
            direct.init(row["prompt"])
            await env.reset(options={"task": ep})
            for _ in range(args.steps):  # a well-formed wrong answer: the episode goes on
                t = time.perf_counter()
                direct.step("#### -1")
                d.append(time.perf_counter() - t)
                t = time.perf_counter()
                await env.step("#### -1")
                a.append(time.perf_counter() - t)
        await env.close()
    return d, a


async def case_openenv(args) -> tuple[list[float], list[float]]:
    """The echo server of tests/adapters/openenv_server.py under OpenEnv's own ``create_app``, in .venv-openenv.

    Direct: a raw WebSocket session sending the step message and reading the answer (the protocol's own
    round trip); adapter: ``await env.step`` on a session of its own, against the same server.
    """
    from websockets.asyncio.client import connect

    from agentenv.adapters.openenv_env import session_url
    from tests.adapters import openenv_launch

    try:
        procs, urls = await asyncio.to_thread(openenv_launch.start, ("echo",))
    except FileNotFoundError as exc:
        raise ImportError(str(exc)) from exc
    try:
        env = agentenv.make("openenv/echo", url=urls["echo"])
        step = json.dumps({"type": "step", "data": {"message": "wrong"}})
        d, a = [], []
        async with connect(session_url(urls["echo"])) as direct:
            for ep in range(args.episodes):
                await direct.send(json.dumps({"type": "reset", "data": {"seed": ep}}))
                await direct.recv()
                await env.reset(options={"task": ep % len(env.tasks())})
                for _ in range(args.steps):
                    t = time.perf_counter()
                    await direct.send(step)
                    json.loads(await direct.recv())
                    d.append(time.perf_counter() - t)
                    t = time.perf_counter()
                    await env.step("wrong")
                    a.append(time.perf_counter() - t)
        await env.close()
    finally:
        openenv_launch.stop(procs)
    return d, a


async def case_verifiers(args) -> tuple[list[float], list[float]]:
    """The ToolEnv of tests/adapters/verifiers_envs under verifiers' own loop, in .venv-verifiers; per episode.

    A scripted policy (a tool call, then the sum) plays whole episodes through ``VerifiersEnv``. Direct:
    verifiers' own ``run_rollout`` as the runner times it (its prompt, its two model calls through the
    endpoint, its tool, its rubric); adapter: the episode as agentenv plays it (``play_episode``: the
    session, the request to the runner process and its answer, the record). The difference is what
    the adapter adds per episode.
    """
    import os

    from agentenv.adapters import verifiers_env
    from agentenv.rollout.episode import RolloutConfig, run_episode_samples
    from tests.adapters.test_verifiers_env import CALL, ENVS, NAME, PYTHON
    from tests.agents.test_endpoint_stream import ScriptedReplies
    from tests.agents.tiny import tool_renderer

    if not PYTHON.is_file():
        raise ImportError(f"no verifiers environment at {PYTHON} (bash scripts/install_verifiers.sh)")
    os.environ["PYTHONPATH"] = str(ENVS)
    env = verifiers_env.VerifiersEnv(NAME, python=PYTHON)
    renderer = tool_renderer()
    cfg = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=800)
    engine = ScriptedReplies(renderer, [])  # one engine, as in training (a new one restarts the endpoint)
    d, a = [], []
    for ep in range(args.episodes + 1):
        engine.replies += [CALL, "The sum is 5."]
        t = time.perf_counter()
        (row,) = await run_episode_samples(env, engine, renderer, cfg, seed=0, options={"task": 0})
        wall = time.perf_counter() - t
        assert row.reward == 1.0, row.info
        if ep:  # the first starts the process
            a.append(wall)
            d.append(env.last_result["rollout_s"])
    await env.close()
    return d, a


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--steps", type=int, default=6, help="steps per episode (reasoning_gym: items per episode)")
    p.add_argument("--deadline-s", type=float, default=120.0)
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--only", nargs="+", default=None, help="run these cases only (gym, gem, textarena, ...)")
    args = p.parse_args()
    cases = {
        "gym (inline)": lambda: case_gym(args, in_thread=False),
        "gym (worker thread, default)": lambda: case_gym(args, in_thread=True),
        "gem": lambda: case_gem(args),
        "textarena": lambda: case_textarena(args),
        "reasoning_gym": lambda: case_reasoning_gym(args),
        "skyrl_gym": lambda: case_skyrl_gym(args),
        "openenv": lambda: case_openenv(args),
        "verifiers": lambda: case_verifiers(args),
    }
    if args.only:
        cases = {name: run for name, run in cases.items() if name.split(" ")[0] in args.only}
    rows = {}
    for name, run in cases.items():
        try:
            d, a = await asyncio.wait_for(run(), timeout=args.deadline_s / len(cases))
        except ImportError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        (dm, dp), (am, ap) = quantiles(d), quantiles(a)
        rows[name] = {"steps": len(d), "direct_median_us": dm * 1e6, "direct_p95_us": dp * 1e6,
                      "adapter_median_us": am * 1e6, "adapter_p95_us": ap * 1e6,
                      "overhead_median_us": (am - dm) * 1e6, "overhead_p95_us": (ap - dp) * 1e6}
    print(f"python {platform.python_version()}, {platform.machine()}")
    print("| adapter | steps | direct median / p95 | adapter median / p95 | overhead median / p95 |")
    print("|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['steps']} | {r['direct_median_us']:.1f} / {r['direct_p95_us']:.1f} us | "
              f"{r['adapter_median_us']:.1f} / {r['adapter_p95_us']:.1f} us | "
              f"{r['overhead_median_us']:.1f} / {r['overhead_p95_us']:.1f} us |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
