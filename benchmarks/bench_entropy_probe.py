"""The entropy probe's cost against the learner update it follows, in one process.

After every update the trainer scores ``run.entropy_probe`` fixed rows without gradient
(``probe/policy_entropy``: the exact entropy of pi at their policy tokens). This measures, on the CPU
default's model (SmolLM2-135M-Instruct, float32, micro-batches of at most 512 tokens) and 16
recipe-shaped rows (``bench_learner_memory._rows``: a 250-token shared system prompt, then prompt,
policy and observation tokens), one learner update and then ``Learner.entropy`` on 16 and on 4 of
the rows, ``--repeats`` times after one warm-up update; it prints the medians in seconds and each
probe's share of the update.

Usage (about 4 minutes on the idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_entropy_probe.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from bench_learner_memory import _rows
    from bench_learner_step import default_learner

    learner = default_learner(512)
    learner.update(_rows({"rows": 16, "prefix": 250}, 1))  # AdamW's moments are created
    times: dict[str, list[float]] = {"update": [], "probe_16_rows": [], "probe_4_rows": []}
    for i in range(args.repeats):
        rows = _rows({"rows": 16, "prefix": 250}, 2 + i)
        for key, call, batch in (("update", learner.update, rows), ("probe_16_rows", learner.entropy, rows),
                                 ("probe_4_rows", learner.entropy, rows[:4])):
            start = time.perf_counter()
            call(batch)
            times[key].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    print("| measured | seconds (median) | share of the update |\n|---|---:|---:|")
    for key, value in median.items():
        print(f"| {key} | {value:.1f} | {value / median['update']:.2f} |")
    print(json.dumps({"median_s": median, "all_s": times}))


if __name__ == "__main__":
    main()
