"""``agentenv envs``: time of the command in a fresh process, with an empty and with a filled cache.

Each repeat runs ``python -m agentenv.cli envs`` (and ``envs --json``) as a new process in this
checkout, with ``AGENTENV_CACHE`` pointing at a temporary folder: "cold" empties that folder before
every run, "warm" runs again on the folder the previous run left. Baseline in the same run:
``python -c "import agentenv"``, the floor of any ``agentenv`` command. Prints, per case, the median,
min and max wall time and the median CPU time (user + sys of the process; on a loaded machine the
figure to compare) of ``--repeats`` runs, and the number of ids listed (cold and warm must agree).

    .venv/bin/python benchmarks/bench_envs_listing.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def timed(argv: list[str], cache: Path) -> tuple[float, float, str]:
    """Run ``argv`` in the checkout with ``AGENTENV_CACHE=cache``; return wall and CPU seconds, and stdout.

    Raises:
        subprocess.CalledProcessError: The command exited non-zero.
    """
    env = {**os.environ, "AGENTENV_CACHE": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, done.stdout


def ids_of(stdout: str, as_json: bool) -> list[str]:
    """The ids a listing printed (the ``--json`` rows' ``id``, else each line's first word)."""
    if as_json:
        return [row["id"] for row in json.loads(stdout)]
    return [line.split()[0] for line in stdout.splitlines() if line.strip()]


def measure(argv: list[str], cache: Path, repeats: int, *, cold: bool) -> tuple[list[float], list[float], str]:
    """Wall and CPU times of ``repeats`` runs of ``argv``, and the last one's stdout."""
    walls, cpus, out = [], [], ""
    for _ in range(repeats):
        if cold:
            shutil.rmtree(cache, ignore_errors=True)
        wall, cpu, out = timed(argv, cache)
        walls.append(wall)
        cpus.append(cpu)
    return walls, cpus, out


def row(name: str, walls: list[float], cpus: list[float], listed: str) -> str:
    med = statistics.median(walls)
    return (
        f"{name:<28} wall median {med:6.3f} s  min {min(walls):6.3f}  max {max(walls):6.3f}  "
        f"CPU median {statistics.median(cpus):6.3f} s  {listed}"
    )


def main(argv: list[str] | None = None) -> int:
    """Measure and print; return 1 when a cold and a warm listing print different ids."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per case (median, min, max)")
    args = parser.parse_args(argv)
    py = sys.executable
    where = subprocess.run(
        [py, "-c", "import agentenv; print(agentenv.__file__)"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    print(
        f"python {sys.version.split()[0]}, agentenv from {where}, load average {os.getloadavg()[0]:.1f}, "
        f"{args.repeats} runs each"
    )
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        walls, cpus, _ = measure([py, "-c", "import agentenv"], cache, args.repeats, cold=True)
        print(row("import agentenv (baseline)", walls, cpus, ""))
        for extra in ([], ["--json"]):
            cmd = [py, "-m", "agentenv.cli", "envs", *extra]
            listed = []
            for label, cold in (("cold", True), ("warm", False)):
                walls, cpus, out = measure(cmd, cache, args.repeats, cold=cold)
                listed.append(ids_of(out, bool(extra)))
                print(row(f"{' '.join(['agentenv envs', *extra])}, {label}", walls, cpus, f"{len(listed[-1])} ids"))
            same = same and listed[0] == listed[1]
    print("cold and warm listings agree" if same else "cold and warm listings DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
