"""``benchmarks/gpu_check.py --tiny`` runs end to end on the CPU and writes its JSON (budget ~20 s).

The H200 run uses the same code paths with the Qwen2.5-1.5B-shaped config; this keeps the prepared
script known to run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_tiny_runs_and_writes_json(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "gpu_check.py"),
            "--tiny",
            "--repeats",
            "1",
            "--decode-batches",
            "1,2",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert data["config"] == "tiny" and data["rows"] == 2 and data["seq"] == 64
    for key in ("nll_fwd_bwd", "fr_fwd_bwd", "fr_update", "score", "objective_only"):
        assert data[key]["ms"] > 0, key
    assert data["fr_update"]["stepped"] is True and data["fr_update"]["admitted_fraction"] == 1.0
    assert data["tokens"]["policy_tokens"] > 0
    assert set(data["decode"]) == {"1", "2"} and all(
        v["tokens"] == 2 * int(k) * 4 or v["tokens"] > 0 for k, v in data["decode"].items()
    )
    try:
        import deepspeed  # noqa: F401
        import openrlhf  # noqa: F401
    except ImportError:
        assert "skipped" in data["deepspeed_update"]
    else:
        assert data["deepspeed_update"].get("stepped") is True, data["deepspeed_update"]
    assert "median ms" in proc.stdout and "decode tokens/s" in proc.stdout
    if "learner_error" in data or "decode_error" in data:
        pytest.fail(f"{data.get('learner_error')} {data.get('decode_error')}")
