"""LoRA against full fine-tuning on the default model: bytes per weight sync, sync time, update time, peak memory.

The CPU default's policy (SmolLM2-135M-Instruct, float32) as the single learner beside a transformers
engine serving a copy of it, as in ``agentenv train``; each setting in its own process, so that its peak
resident set (``VmHWM``, GB: model, engine copy, AdamW's state and the step together) is its own. Per
setting: one warm-up update (AdamW's state is created), then ``--updates`` rounds of one update on 16
recipe-shaped rows (:mod:`bench_learner_step`'s, 512-token micro-batches) and one sync
(``learner.weights_for_engine()`` then ``engine.update_weights``). Reported: trainable numbers, bytes
sent per sync, median sync and update seconds, and their ratios to full fine-tuning measured in the same
run. LoRA: adapters of ``--rank`` on every linear layer but the output projection (alpha 32).

Usage (about 4 minutes on the idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_lora.py [--rank 16] [--updates 3]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import statistics
import subprocess
import sys
import time


async def run_one(rank: int, updates: int) -> dict:
    """Update and sync timings for LoRA of ``rank`` (0: full fine-tuning) in this process."""
    import torch

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_learner_memory import _rows, _rss

    from agentenv.engines.transformers_engine import TransformersEngine
    from agentenv.malloc import return_freed_memory_to_os
    from agentenv.models import load_model_and_tokenizer
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.lora import add_lora
    from agentenv.trainer.learners.single import Learner

    return_freed_memory_to_os()  # as agentenv train does
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(None)
    if rank:
        add_lora(model, rank=rank, alpha=32.0, targets=("all-linear",))
    learner = Learner(model, OptimConfig(lr=3e-5), objective=ObjectiveConfig(delta=10.0),
                      execution=LearnerConfig(micro_batch_size=16, max_tokens_per_micro_batch=512))
    engine = TransformersEngine(copy.deepcopy(model), None, max_batch_size=16, seed=0)
    shape = {"rows": 16, "prefix": 250}
    learner.update(_rows(shape, 1))  # warm-up: AdamW's moments are created
    update_s, sync_s, sent_bytes = [], [], 0
    try:
        for i in range(updates):
            t0 = time.perf_counter()
            st = learner.update(_rows(shape, 2 + i))
            update_s.append(time.perf_counter() - t0)
            assert st.stepped
            t0 = time.perf_counter()
            weights = learner.weights_for_engine()
            await engine.update_weights(weights, learner.version)
            sync_s.append(time.perf_counter() - t0)
            sent_bytes = sum(t.numel() * t.element_size() for t in {id(t): t for t in weights.values()}.values())
            del weights
    finally:
        await engine.close()
    return {"rank": rank, "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "sync_bytes": sent_bytes, "sync_s": statistics.median(sync_s), "update_s": statistics.median(update_s),
            "all_sync_s": sync_s, "all_update_s": update_s, "peak_rss_gb": _rss("VmHWM") / 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process's rank
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(run_one(args.one, args.updates))))
        return
    results = []
    for rank in (0, args.rank):
        out = subprocess.run([sys.executable, __file__, "--one", str(rank), "--updates", str(args.updates)],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = results[0]
    print("| setting | trainable numbers | bytes per sync | sync (s, median) | update (s, median) | peak RSS (GB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        name = "full fine-tuning" if r["rank"] == 0 else f"LoRA r={r['rank']}, all linear"
        print(f"| {name} | {r['trainable'] / 1e6:.2f} M | {r['sync_bytes'] / 1e6:.1f} MB | {r['sync_s']:.3f} "
              f"({r['sync_s'] / full['sync_s']:.2f}x) | {r['update_s']:.1f} ({r['update_s'] / full['update_s']:.2f}x) "
              f"| {r['peak_rss_gb']:.2f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
