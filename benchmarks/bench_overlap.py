"""Asynchronous vs synchronous training at equal updates: wall-clock, busy time of each part, overlap bound.

``trainer.train.train()`` runs unchanged twice, once with ``run.mode=sync`` (the baseline: collect B
episodes, then update) and once with ``run.mode=async`` (PACE, ``drift_mode=token_share`` as in the
CPU recipe), for the same number of updates, each after a discarded one-update warm-up run. The
parts are real: RolloutCollector, TrajectoryPool, the TransformersEngine and the single-process
Learner on a random Llama (``--hidden``, ``--layers``, 1024 tokens, one character per token). Only
the environment is a stand-in: ``--turns`` tool calls per episode, each an ``asyncio.sleep`` of
``--tool-latency`` seconds (a sandbox answering from another process: no CPU of this one), reward 1
for an even first character. Every batch takes its step (``optim.step_on_zero_gradient=true``).

Per mode it prints the update loop's wall-clock, the busy seconds of the engine, the environments
and the learner (:mod:`agentenv.trainer.overlap`; the learner from ``learner.update`` until the
engine holds the new weights), the overlap bound ``S / max`` and the overlap achieved ``S / wall``
with ``S`` the sum of the three, then async/sync wall-clock (target: <= 0.67) and the
share of the bound the asynchronous run achieved (target: >= 0.9). About a minute on 2 CPU cores:

    .venv/bin/python benchmarks/bench_overlap.py [--updates 8] [--tool-latency 0.2] [--hidden 256] [--layers 4]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, ClassVar

import torch

from agentenv.core import Env, StepResult
from agentenv.rollout.episode import Renderer
from agentenv.trainer import recipe, setup
from agentenv.trainer import train as train_loop

EOT = 1000  # the renderer's end-of-turn token


class CharRenderer(Renderer):
    """One token per character (code point mod 256); ``EOT`` ends a turn."""

    stop_token_ids = (EOT,)

    def initial_prompt(self, user_text: str, *, system: str | None = None, tools: Any = ()) -> list[int]:
        return [ord(c) % 256 for c in f"U:{user_text}\nA:"]

    def observation_tokens(self, role: str, content: str) -> list[int]:
        return [ord(c) % 256 for c in f"{role[0].upper()}:{content}\nA:"]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids if i != EOT)


def tool_env(turns: int, latency_s: float) -> type[Env]:
    """An environment class: ``turns`` steps, each waiting ``latency_s`` seconds; the last one grades."""

    class ToolLatencyEnv(Env[str, str]):
        cut_turn: ClassVar[str] = "act"  # replies end at the token budget (a random model rarely says EOT)
        observation_role: ClassVar[str] = "tool"

        async def reset(self, *, seed=None, options=None):
            await super().reset(seed=seed)
            self.t = 0
            return "pick", {"task_id": f"even-{seed}"}

        async def step(self, action):
            await asyncio.sleep(latency_s)
            self.t += 1
            if self.t < turns:
                return StepResult(f"out{self.t}", 0.0, False, False, {})
            return StepResult("", 1.0 if action and ord(action[0]) % 2 == 0 else 0.0, True, False, {})

    return ToolLatencyEnv


def random_lm(hidden: int, layers: int) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256)
    return transformers.LlamaForCausalLM(cfg).eval()


def overrides(args: argparse.Namespace, mode: str, updates: int) -> list[str]:
    b = args.batch
    return ["warmup.steps=0", "eval.problems=0", f"run.batch_size={b}", f"run.concurrency={b}",
            f"run.max_pool_size={2 * b}", "run.checkpoint_every=100000", f"run.updates={updates}",
            f"rollout.max_turns={args.turns}", f"rollout.max_new_tokens_per_turn={args.new_tokens}",
            "rollout.max_total_tokens=200", f"learner.micro_batch_size={b}", "objective.delta=5.0",
            "optim.step_on_zero_gradient=true", "learner.gradient_checkpointing=false", f"model.max_batch_size={b}",
            "run.seed=0", f"run.mode={mode}", f"staleness.policy={'sync' if mode == 'sync' else 'pace'}",
            "staleness.drift_mode=token_share"]


def run(args: argparse.Namespace, mode: str, updates: int, folder: Path) -> dict[str, Any]:
    """One training run; returns its summary (``overlap/*`` figures included)."""
    cfg, _ = recipe.parse_args(["--run-dir", str(folder / f"{mode}-{updates}"), *overrides(args, mode, updates)])
    run_dir = recipe.prepare_run_dir(cfg, resume=False, overwrite=False)
    summary = asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir), 150))
    if summary["updates"] != updates:
        raise RuntimeError(f"{mode}: {summary['updates']} updates instead of {updates}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="B = run.concurrency (default: %(default)s)")
    ap.add_argument("--turns", type=int, default=2, help="tool calls per episode (default: %(default)s)")
    ap.add_argument("--tool-latency", type=float, default=0.2, help="seconds per tool call (default: %(default)s)")
    ap.add_argument("--new-tokens", type=int, default=24, help="tokens per reply (default: %(default)s)")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    env_cls = tool_env(args.turns, args.tool_latency)
    # the recipe's model and environment builders, replaced as the tests do (random model, stand-in env)
    setup.load_policy = lambda cfg, **_: (random_lm(args.hidden, args.layers), None, CharRenderer())
    setup.env_factory = lambda cfg, renderer=None: env_cls
    print(f"{os.cpu_count()} CPUs, torch {torch.get_num_threads()} threads; B={args.batch}, {args.updates} updates, "
          f"{args.turns} tool calls x {args.tool_latency} s, {args.new_tokens} tokens per reply, "
          f"Llama {args.layers}x{args.hidden}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("sync", "async"):
            run(args, mode, 1, Path(tmp))  # warm-up: first-call costs stay out of the figures
            results[mode] = run(args, mode, args.updates, Path(tmp))
            print(f"{mode}: update loop {results[mode]['overlap/wall_s']:.1f} s", flush=True)
    cols = ("wall_s", "engine_s", "env_s", "learner_s", "bound", "achieved", "of_bound")
    print("| mode | " + " | ".join(cols) + " |\n|" + "---|" * (len(cols) + 1))
    for mode, s in results.items():
        print(f"| {mode} | " + " | ".join(f"{s['overlap/' + c]:.2f}" for c in cols) + " |")
    ratio = results["async"]["overlap/wall_s"] / results["sync"]["overlap/wall_s"]
    print(f"async/sync wall-clock: {ratio:.3f}x (target <= 0.67); async achieved/bound: "
          f"{results['async']['overlap/of_bound']:.3f} (target >= 0.9)")


if __name__ == "__main__":
    main()
