"""Peak resident memory and time of the CPU default's learner update, per memory setting.

Each setting runs in its own process (peak RSS only grows within a process) on the real default
model (SmolLM2-135M-Instruct, float32) and the same synthetic batch: B = 8 trajectories shaped like
the CPU recipe's (a 200-token prompt, 80 policy tokens, a 30-token observation, 70 policy tokens).
Four updates are timed (the first creates AdamW's state; the later ones show whether the peak keeps
growing), each with a scoring pass on another thread first, as in the trainer.

Settings:

* ``full_mb4`` (the baseline: the recipe before this benchmark): micro-batches of 4 rows, logits over
  the whole vocabulary at every position;
* ``keep_mb4``: the vocabulary projection only at policy-token positions (``logits_to_keep``);
* ``keep_mb1``: that, with micro-batches of 1 row (no padding; the CPU recipe's setting);
* ``keep_mb1_mmap``: that, with glibc's mmap threshold fixed at 1 MiB
  (:func:`agentenv.malloc.return_freed_memory_to_os`, what ``agentenv train`` does).

Printed: seconds per update (scoring pass excluded) and peak RSS after each update (GB), and both
as ratios to the baseline. Usage::

    .venv/bin/python benchmarks/bench_learner_memory.py
"""

from __future__ import annotations

import json
import random
import resource
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

SETTINGS = {"full_mb4": (False, 4, False), "keep_mb4": (True, 4, False), "keep_mb1": (True, 1, False),
            "keep_mb1_mmap": (True, 1, True)}
UPDATES = 4


def _trajectory(seed: int):
    from agentenv.trajectory import Trajectory

    rng = random.Random(seed)
    draw = lambda n: [rng.randrange(1000, 40000) for _ in range(n)]  # noqa: E731
    t = Trajectory(start_version=0)
    t.append_environment_tokens(draw(200))
    t.append_policy_tokens(draw(80), [-1.0] * 80, 0, 0)
    t.append_environment_tokens(draw(30))
    t.append_policy_tokens(draw(70), [-1.0] * 70, 0, 0)
    t.completion_version = 0
    t.reward = float(seed % 2)
    return t


def run_one(name: str) -> dict:
    """Two updates under setting ``name``; returns seconds and peak RSS (GB) per update."""
    import torch

    from agentenv.models import load_model_and_tokenizer
    from agentenv.trainer.learner import Learner, OptimConfig

    keep, micro, mmap = SETTINGS[name]
    if mmap:
        from agentenv.malloc import return_freed_memory_to_os

        return_freed_memory_to_os()
    model, _ = load_model_and_tokenizer(None)
    if not keep:
        inner = model

        class FullLogits(torch.nn.Module):  # hides logits_to_keep: the whole (b, L, V) projection
            def __init__(self) -> None:
                super().__init__()
                self.inner = inner

            def forward(self, input_ids, attention_mask):
                return self.inner(input_ids=input_ids, attention_mask=attention_mask)

        model = FullLogits()
    learner = Learner(model, OptimConfig(micro_batch_size=micro, lr=1e-6, delta=10.0))
    out = {"setting": name, "seconds": [], "peak_rss_gb": []}
    scorer = ThreadPoolExecutor(1)
    for i in range(UPDATES):
        batch = [_trajectory(100 * i + k) for k in range(8)]
        scores = scorer.submit(learner.score, batch).result()
        t0 = time.perf_counter()
        learner.update(batch, scores=scores)
        out["seconds"].append(time.perf_counter() - t0)
        out["peak_rss_gb"].append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9)
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        print(json.dumps(run_one(sys.argv[2])))
        return
    rows = []
    for name in SETTINGS:
        done = subprocess.run([sys.executable, __file__, "--one", name], capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = rows[0]
    steady = lambda r: statistics.median(r["seconds"][1:])  # noqa: E731 (the first update builds AdamW state)
    print(f"{'setting':<14} {'update s':>9} {'peak RSS GB per update':>32} {'time ratio':>11} {'peak ratio':>11}")
    for r in rows:
        peaks = " ".join(f"{p:.2f}" for p in r["peak_rss_gb"])
        print(f"{r['setting']:<14} {steady(r):>9.1f} {peaks:>32} {steady(r) / steady(base):>11.2f} "
              f"{r['peak_rss_gb'][-1] / base['peak_rss_gb'][-1]:>11.2f}")


if __name__ == "__main__":
    main()
