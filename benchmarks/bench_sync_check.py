"""The sampling check's probe gap on the CPU default: at a correct sync, and after a sync that did not take.

The default recipe's model (SmolLM2-135M-Instruct after its cached warm-up, float32) as the learner and
the transformers engine; the probe of :mod:`agentenv.trainer.sync_check` (the first rows' prompts of a
batch of python_tool episodes, 16 tokens each, the run's sampling transform). Reported, in nats per
token: the gap at version 0 (engine and learner hold the same weights), then, after ``--updates``
learner updates on batches of that policy's episodes at the recipe's lr schedule, the gap when the
engine was synced (lag 0 again; alone, and sharing the engine's batches with 16 episodes in flight)
and when it kept the version-0 weights (a sync that did not take), with the bound the run applies.
One process; about 3 minutes (``--updates 1``) on the idle 2-core CPU.

Usage::

    .venv/bin/python benchmarks/bench_sync_check.py [--updates 1]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import platform
import time


async def measure(updates: int) -> dict:
    """The probe gaps (nats per token) at version 0, after a sync, and after a sync that did not take."""
    import torch

    from agentenv.rollout.collector import RolloutCollector
    from agentenv.trainer import setup
    from agentenv.trainer.recipe import parse_args
    from agentenv.trainer.sync_check import SyncCheck, sync_check

    cfg, _ = parse_args(["eval.problems=0"])
    torch.manual_seed(0)
    model, tokenizer, renderer = setup.load_policy(cfg)
    learner = setup.build_learner(cfg, model)
    synced = setup.build_engine(cfg, copy.deepcopy(model), tokenizer)
    stale = setup.build_engine(cfg, copy.deepcopy(model), tokenizer)  # never sees an update
    check = sync_check(cfg)
    assert isinstance(check, SyncCheck)
    collector = RolloutCollector(setup.env_factory(cfg, renderer), synced, renderer, cfg.rollout, None,
                                 on_group=lambda group: None,  # collect() returns the batch itself
                                 concurrency=cfg.run.concurrency, version_fn=lambda: learner.version)
    out: dict = {"bound": check.bound}
    try:
        batch = await collector.collect(cfg.run.batch_size)
        check.take_prompts(batch)
        out["gap_version_0"] = await check.after_sync(synced, learner, 0)
        for _ in range(updates):
            stats = await asyncio.to_thread(learner.update, batch)
            assert stats.stepped, "a batch without gradient: rerun with another seed"
            await synced.update_weights(learner.weights_for_engine(), learner.version)
            batch = await collector.collect(cfg.run.batch_size)
        out["lr_last_update"] = stats.lr
        out["gap_synced"] = await check.after_sync(synced, learner, learner.version)
        # as in a run: the probe's requests share the engine's batches with episodes in flight
        batch, out["gap_synced_under_load"] = await asyncio.gather(
            collector.collect(cfg.run.batch_size), check.after_sync(synced, learner, learner.version))
        out["gap_sync_not_taken"] = await check.probe_gap(stale, learner, 0)  # its tokens say version 0
    finally:
        await collector.close()
        await synced.close()
        await stale.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=1, help="learner updates before the second probe")
    args = parser.parse_args()
    t0 = time.time()
    out = asyncio.run(measure(args.updates))
    out.update(updates=args.updates, seconds=round(time.time() - t0, 1), machine=platform.machine())
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
