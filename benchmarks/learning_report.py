"""Learning across seeds: held-out change per run, mean/sd/min/max over runs, collapse checks, curves.

    .venv/bin/python benchmarks/learning_report.py RUN [RUN ...] [--out DIR]

The same as ``python -m agentenv.trainer.experiments.learning_report`` (see that module for every figure).
"""

from __future__ import annotations

import sys

from agentenv.trainer.experiments.learning_report import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
