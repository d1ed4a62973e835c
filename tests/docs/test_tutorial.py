"""docs/tutorial_own_env.md runs as written: each block in order, in an empty folder.

A block with a ``title`` is a file written under that name; a ``bash`` block runs in bash (``-e``,
``pipefail``) and must exit 0. The only difference from a reader's shell is where ``pip install``
puts the package: a folder of this test (``PIP_TARGET``, on ``PYTHONPATH``), not the shared venv.
The training step uses the page's tiny random model, two updates of four episodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.blocks import code_blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

PAGE = "tutorial_own_env.md"


def run_page(folder: Path) -> list[str]:
    """Play the page's blocks in ``folder``; return each bash block's standard output."""
    site = folder / ".site-packages"
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(site),
        "PIP_TARGET": str(site),
        "PIP_NO_DEPS": "1",
        "PIP_NO_INDEX": "1",
        "PIP_NO_BUILD_ISOLATION": "0",  # pip reads this variable inverted: 0 turns build isolation off
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    outputs = []
    for block in code_blocks(PAGE):
        if block.title is not None:
            path = folder / block.title
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.code)
        elif block.lang == "bash":
            done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=folder, env=env,
                                  capture_output=True, text=True, timeout=400)
            assert done.returncode == 0, f"{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
            outputs.append(done.stdout)
        else:
            raise AssertionError(f"{PAGE}: a {block.lang} block without a title is neither a file nor a command")
    return outputs


def test_the_tutorial_runs_as_written(tmp_path):
    envs, check, train, evaluation, serve = run_page(tmp_path)
    assert "tutorial/Echo-v0" in envs.splitlines()[-1].split() and envs.rstrip().endswith("Repeat a word back.")
    assert "passed: spaces_and_declarations" in check and "close_twice" in check
    assert "Repeat this word: river -> Correct. 1.0 True" in check
    run = tmp_path / "runs" / "echo"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 2 and not summary["interrupted"]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]
    for label, version in (("before", 0), ("after", 2)):
        report = json.loads((run / f"eval_{label}.json").read_text())
        assert report["task_ids"] == ["apple", "river", "stone", "cloud"] and report["version"] == version
    for name in ("config.yaml", "eval_after.json", "summary.json"):
        assert name in train.split()
    report = json.loads((tmp_path / "eval_tiny" / "report.json").read_text())
    assert "report written to eval_tiny/report.json" in evaluation
    assert (report["env"], report["overall"]["games"], report["overall"]["errors"]) == ("tutorial/Echo-v0", 4, 0)
    assert "Repeat this word: apple -> Correct. 1.0" in serve
