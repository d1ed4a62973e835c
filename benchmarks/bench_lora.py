"""LoRA against full fine-tuning on the default model: bytes per weight sync, sync time, update time, peak memory.

The CPU default's policy (SmolLM2-135M-Instruct, float32) as the single learner beside a transformers
engine serving a copy of it, as in ``agentenv train``; each setting in its own process, so that its peak
resident set (``VmHWM``, GB: model, engine copy, AdamW's state and the step together) is its own. Per
setting: one warm-up update (AdamW's state is created), then ``--updates`` rounds of one update on 16
recipe-shaped rows (:mod:`bench_learner_step`'s, 512-token micro-batches) and one sync
(``learner.weights_for_engine()`` then ``engine.update_weights``). Reported: trainable numbers, bytes
sent per sync, median sync and update seconds, and their ratios to full fine-tuning measured in the same
run. LoRA: adapters of ``--rank`` on every linear layer but the output projection (alpha 32).

``--beside-decode``: the engine decodes during every update, as in the asynchronous loop (16 requests
of 64 new tokens after a 250-token prompt, one round after another, until the update ends), so the
update competes with decoding for the cores as it does in ``agentenv train``; the update's seconds and
the tokens decoded beside it are reported.

Usage (about 4 minutes on the idle 2-core CPU; longer beside decoding)::

    .venv/bin/python benchmarks/bench_lora.py [--rank 16] [--updates 3] [--beside-decode]
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


async def keep_decoding(engine, stop: asyncio.Event, decoded: list[int]) -> None:
    """Rounds of 16 requests (250-token prompt, 64 new tokens) until ``stop``; tokens counted in ``decoded``."""
    from agentenv.engines.base import SamplingParams

    prompt = list(range(1000, 1250))
    rnd = 0
    while not stop.is_set():
        outs = await asyncio.gather(*(engine.generate(prompt, SamplingParams(max_new_tokens=64, seed=rnd * 16 + i))
                                      for i in range(16)))
        decoded[0] += sum(len(o.token_ids) for o in outs)
        rnd += 1


async def run_one(rank: int, updates: int, beside_decode: bool = False) -> dict:
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
    update_s, sync_s, sent_bytes, decoded = [], [], 0, [0]
    try:
        for i in range(updates):
            rows = _rows(shape, 2 + i)
            stop = asyncio.Event()
            decoding = asyncio.create_task(keep_decoding(engine, stop, decoded)) if beside_decode else None
            t0 = time.perf_counter()
            st = await asyncio.to_thread(learner.update, rows)
            update_s.append(time.perf_counter() - t0)
            if decoding is not None:
                stop.set()
                await decoding
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
            "all_sync_s": sync_s, "all_update_s": update_s, "peak_rss_gb": _rss("VmHWM") / 1e9,
            "decoded_tokens_per_update_s": decoded[0] / sum(update_s) if beside_decode else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--beside-decode", action="store_true", help="the engine decodes during every update")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child process's rank
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(asyncio.run(run_one(args.one, args.updates, args.beside_decode))))
        return
    results = []
    for rank in (0, args.rank):
        out = subprocess.run([sys.executable, __file__, "--one", str(rank), "--updates", str(args.updates),
                              *(["--beside-decode"] if args.beside_decode else [])],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    full = results[0]
    print("| setting | trainable numbers | bytes per sync | sync (s, median) | update (s, median) | peak RSS (GB) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        name = "full fine-tuning" if r["rank"] == 0 else f"LoRA r={r['rank']}, all linear"
        print(f"| {name} | {r['trainable'] / 1e6:.2f} M | {r['sync_bytes'] / 1e6:.1f} MB | {r['sync_s']:.3f} "
              f"({r['sync_s'] / full['sync_s']:.2f}x) | {r['update_s']:.1f} ({r['update_s'] / full['update_s']:.2f}x) "
              f"| {r['peak_rss_gb']:.2f} |"
              + (f" {r['decoded_tokens_per_update_s']:.1f} tok/s decoded beside |" if args.beside_decode else ""))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
