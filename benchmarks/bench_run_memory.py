"""Where a training run's resident memory goes: memory in use against memory the allocator keeps.

Runs ``agentenv train`` (the README's main command, shortened: ``--updates`` updates and
``eval.problems`` held-out problems) once per setting, each in its own process, with a thread in that
process sampling every ``--every`` seconds:

* ``rss``: the resident set (``VmRSS``, GB);
* ``live``: bytes the program holds: glibc's ``mallinfo2`` bytes in use in every arena plus its
  directly mapped blocks (GB). Everything else resident is the interpreter's and libraries' own pages
  and freed heap memory that glibc keeps (``rss - live``).

Reported per setting: the run's peak RSS (``summary.json``'s ``peak_rss_gb``, the kernel's
high-water mark), the sampled peak of ``live`` (a lower bound: sampled, not tracked), the sampled
``rss - live`` at the sampled RSS peak, and the median update and batch-wait seconds. A setting is
``NAME=OVERRIDES`` (comma-separated ``key=value`` config overrides, empty for the default),
optionally followed by ``;VAR=VALUE`` for each environment variable its process needs (e.g.
``base=;PYTHONPATH=/tmp/wheel_of_main`` runs another tree's code).

Usage (about 5 minutes per setting on the idle 2-core CPU)::

    .venv/bin/python benchmarks/bench_run_memory.py [--updates 3] [--setting default=] \
        [--setting mb256=learner.max_tokens_per_micro_batch=256]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _sample_forever(path: Path, every_s: float) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_learner_memory import _rss

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    with path.open("w") as out:
        while True:
            info = libc.mallinfo2()
            out.write(f"{time.time():.2f} {_rss('VmRSS')} {info.uordblks + info.hblkhd}\n")
            out.flush()
            time.sleep(every_s)


def child(samples: Path, every_s: float, train_args: list[str]) -> int:
    """Run ``agentenv train`` in this process with the sampler thread beside it."""
    threading.Thread(target=_sample_forever, args=(samples, every_s), daemon=True).start()
    from agentenv.cli import main

    return main(["train", *train_args])


def measure(name: str, overrides: list[str], env: dict[str, str], args: argparse.Namespace) -> dict:
    """One setting's run in a fresh process; its figures (GB, seconds)."""
    with tempfile.TemporaryDirectory(prefix=f"run_memory_{name}_") as tmp:
        run, samples = Path(tmp) / "run", Path(tmp) / "samples.txt"
        cmd = [sys.executable, __file__, "--child", str(samples), "--every", str(args.every), "--",
               "--updates", str(args.updates), f"eval.problems={args.eval_problems}", "--run-dir", str(run),
               *overrides]
        subprocess.run(cmd, check=True, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((run / "summary.json").read_text())
        points = [tuple(map(float, line.split())) for line in samples.read_text().splitlines()]
    _, rss_at_peak, live_at_peak = max(points, key=lambda p: p[1])
    return {
        "setting": name, "overrides": overrides, "env": env,
        "peak_rss_gb": summary["peak_rss_gb"],
        "peak_live_gb": max(p[2] for p in points) / 1e9,
        "kept_at_rss_peak_gb": (rss_at_peak - live_at_peak) / 1e9,
        "update_s": statistics.median(r["time/update_s"] for r in rows),
        "wait_s": statistics.median(r["time/wait_s"] for r in rows),
        "updates": len(rows),
    }


def _parse_setting(text: str) -> tuple[str, list[str], dict[str, str]]:
    head, *env_parts = text.split(";")
    name, _, overrides = head.partition("=")
    env = dict(part.split("=", 1) for part in env_parts if part)
    return name, [o for o in overrides.split(",") if o], env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--eval-problems", type=int, default=4)
    parser.add_argument("--every", type=float, default=0.25, help="sampling period (s)")
    parser.add_argument("--setting", action="append", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # a setting's own process
    args, rest = parser.parse_known_args()
    if args.child is not None:
        sys.exit(child(Path(args.child), args.every, [a for a in rest if a != "--"]))
    results = [measure(*_parse_setting(s), args) for s in (args.setting or ["default="])]
    print("| setting | peak RSS (GB) | peak in use (GB, sampled) | kept by the allocator at the RSS peak (GB) "
          "| update (s, median) | batch wait (s, median) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['setting']} | {r['peak_rss_gb']:.2f} | {r['peak_live_gb']:.2f} | "
              f"{r['kept_at_rss_peak_gb']:.2f} | {r['update_s']:.1f} | {r['wait_s']:.1f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
