"""``agentenv eval`` end to end with the real embedded default model (SmolLM2-135M) on real games."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="the alfworld package is not installed (scripts/install_alfworld.sh)")

from agentenv.eval_command import main  # noqa: E402

pytestmark = [pytest.mark.alfworld, pytest.mark.slow]


def test_eval_with_the_default_model(tmp_path: Path, capsys) -> None:
    argv = ["--split", "valid_unseen", "--limit", "2", "--samples-per-game", "1", "--max-steps", "2"]
    argv += ["--max-new-tokens", "16", "--concurrency", "2", "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "overall" in out and "pick_two_obj" in out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["overall"]["episodes"] == 2 and report["overall"]["errors"] == 0
    assert report["model"] == "SmolLM2-135M (embedded)"
    for ep in report["episodes"]:
        assert ep["error"] is None and 1 <= ep["steps"] <= 2
        assert ep["ending"] in {"won", "truncated", "max_new_tokens_per_turn", "max_total_tokens", "context"}
