"""One learner update of the default model on recipe-shaped rows: peak memory and time against the token budget.

The CPU default's learner step (SmolLM2-135M-Instruct, float32, 16 rows shaped like the python_tool
recipe's: a 250-token shared system prompt, then 30 prompt, 90 policy, 30 observation and 60 policy
tokens, lengths varied by up to 25%) under each ``learner.max_tokens_per_micro_batch`` setting, every
setting in its own process so that its peak resident set (``VmHWM``, GB; the model, AdamW's state and
the step together) is its own. Per setting: one warm-up update (AdamW's state is created), then
``--updates`` timed updates; reported are the median update seconds and their ratio to ``none`` (one
padded pass of all 16 rows, the prefix served inside it) measured in the same run. The chunked
log-probabilities (``learner.logprob_chunk_tokens`` 1024) are on in every setting.

``--frozen-layers K,...`` also times each budget with the token embedding (and so a tied output head)
and the first ``K`` decoder layers frozen: AdamW holds only the trained weights, and the backward pass
stops at the lowest trained layer. 0 trains every weight, as the recipe does.

Usage (about 5 minutes on the idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_learner_step.py [--budgets none,512,1024,2048] [--updates 3]
        [--frozen-layers 0,15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def default_learner(budget: int | None, frozen_layers: int = 0):
    """The CPU default's learner (the embedded model, float32, 2 threads) at ``budget`` tokens per micro-batch.

    With ``frozen_layers`` K > 0 the token embedding and decoder layers ``0..K-1`` take no gradient.
    """
    import torch

    from agentenv.malloc import return_freed_memory_to_os
    from agentenv.models import load_model_and_tokenizer
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.single import Learner

    return_freed_memory_to_os()  # as agentenv train does
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(None)
    if frozen_layers:
        frozen = [model.get_input_embeddings(), *model.model.layers[:frozen_layers]]
        for module in frozen:
            module.requires_grad_(False)
    return Learner(model, OptimConfig(lr=3e-5), objective=ObjectiveConfig(delta=10.0),
                   execution=LearnerConfig(micro_batch_size=16, max_tokens_per_micro_batch=budget))


def run_one(budget: int | None, updates: int, frozen_layers: int = 0) -> dict:
    """Time ``updates`` updates (after one warm-up) at ``budget`` tokens per micro-batch in this process."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_learner_memory import _rows, _rss

    learner = default_learner(budget, frozen_layers)
    rows = _rows({"rows": 16, "prefix": 250}, 1)
    learner.update(rows)  # warm-up: AdamW's moments are created
    seconds = []
    for i in range(updates):
        rows = _rows({"rows": 16, "prefix": 250}, 2 + i)
        t0 = time.perf_counter()
        st = learner.update(rows)
        seconds.append(time.perf_counter() - t0)
        assert st.stepped
    trained = sum(p.numel() for p in learner.model.parameters() if p.requires_grad)
    return {"budget": budget, "frozen_layers": frozen_layers, "trained_params": trained,
            "update_s": statistics.median(seconds), "all_s": seconds,
            "peak_rss_gb": _rss("VmHWM") / 1e9, "sequence_tokens": st.mean_sequence_length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="none,512,1024,2048")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--frozen-layers", default="0", help="comma-separated K: embedding and first K layers frozen")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process's setting
    parser.add_argument("--one-frozen", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        budget = None if args.one == "none" else int(args.one)
        print(json.dumps(run_one(budget, args.updates, args.one_frozen)))
        return
    results = []
    for b in args.budgets.split(","):
        for k in args.frozen_layers.split(","):
            out = subprocess.run([sys.executable, __file__, "--one", b, "--one-frozen", k, "--updates",
                                  str(args.updates)], capture_output=True, text=True, check=True)
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = results[0]["update_s"]
    print("| max_tokens_per_micro_batch | frozen layers | trained parameters | peak RSS (GB) | update (s, median) "
          "| ratio to the first row |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['budget'] or 'none'} | {r['frozen_layers']} | {r['trained_params'] / 1e6:.1f} M | "
              f"{r['peak_rss_gb']:.2f} | {r['update_s']:.1f} | {r['update_s'] / base:.2f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
