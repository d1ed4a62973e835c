"""One learner update of the default model on recipe-shaped rows: peak memory and time against the token budget.

The CPU default's learner step (SmolLM2-135M-Instruct, float32, 16 rows shaped like the python_tool
recipe's: a 250-token shared system prompt, then 30 prompt, 90 policy, 30 observation and 60 policy
tokens, lengths varied by up to 25%) under each ``learner.max_tokens_per_micro_batch`` setting, every
setting in its own process so that its peak resident set (``VmHWM``, GB; the model, AdamW's state and
the step together) is its own. Per setting: one warm-up update (AdamW's state is created), then
``--updates`` timed updates; reported are the median update seconds and their ratio to ``none`` (one
padded pass of all 16 rows, the prefix served inside it) measured in the same run. The chunked
log-probabilities (``learner.logprob_chunk_tokens`` 1024) are on in every setting.

Usage (about 5 minutes on the idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_learner_step.py [--budgets none,512,1024,2048] [--updates 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def default_learner(budget: int | None):
    """The CPU default's learner (the embedded model, float32, 2 threads) at ``budget`` tokens per micro-batch."""
    import torch

    from agentenv.malloc import return_freed_memory_to_os
    from agentenv.models import load_model_and_tokenizer
    from agentenv.trainer.learners.config import LearnerConfig, ObjectiveConfig, OptimConfig
    from agentenv.trainer.learners.single import Learner

    return_freed_memory_to_os()  # as agentenv train does
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model, _ = load_model_and_tokenizer(None)
    return Learner(model, OptimConfig(lr=3e-5), objective=ObjectiveConfig(delta=10.0),
                   execution=LearnerConfig(micro_batch_size=16, max_tokens_per_micro_batch=budget))


def run_one(budget: int | None, updates: int) -> dict:
    """Time ``updates`` updates (after one warm-up) at ``budget`` tokens per micro-batch in this process."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_learner_memory import _rows, _rss

    learner = default_learner(budget)
    rows = _rows({"rows": 16, "prefix": 250}, 1)
    learner.update(rows)  # warm-up: AdamW's moments are created
    seconds = []
    for i in range(updates):
        rows = _rows({"rows": 16, "prefix": 250}, 2 + i)
        t0 = time.perf_counter()
        st = learner.update(rows)
        seconds.append(time.perf_counter() - t0)
        assert st.stepped
    return {"budget": budget, "update_s": statistics.median(seconds), "all_s": seconds,
            "peak_rss_gb": _rss("VmHWM") / 1e9, "sequence_tokens": st.mean_sequence_length}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budgets", default="none,512,1024,2048")
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(run_one(None if args.one == "none" else int(args.one), args.updates)))
        return
    results = []
    for b in args.budgets.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", b, "--updates", str(args.updates)],
                             capture_output=True, text=True, check=True)
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    base = next((r["update_s"] for r in results if r["budget"] is None), None)
    print("| max_tokens_per_micro_batch | peak RSS (GB) | update (s, median) | ratio to none |")
    print("|---|---:|---:|---:|")
    for r in results:
        ratio = f"{r['update_s'] / base:.2f}" if base else "-"
        print(f"| {r['budget'] or 'none'} | {r['peak_rss_gb']:.2f} | {r['update_s']:.1f} | {ratio} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
