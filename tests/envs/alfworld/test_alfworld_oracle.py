"""The walkthrough oracle wins every seen and unseen game (the whole stack, without a model)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("alfworld", reason="the alfworld package is not installed (scripts/install_alfworld.sh)")

from agentenv.envs.alfworld.games import TASK_TYPES  # noqa: E402
from agentenv.envs.alfworld.oracle import oracle_main, run_oracle  # noqa: E402

pytestmark = pytest.mark.alfworld


def test_oracle_command_on_a_few_games(tmp_path: Path, capsys) -> None:
    assert (
        oracle_main(
            ["--split", "unseen", "--limit", "3", "--workers", "1", "--no-progress", "--out", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "overall" in out and "100.0" in out
    assert (tmp_path / "report.json").is_file()
    again = ["--split", "unseen", "--limit", "1", "--workers", "1", "--no-progress", "--out", str(tmp_path)]
    assert oracle_main(again) == 2  # a report is there: replaced only when asked
    assert "pass --overwrite" in capsys.readouterr().err
    assert oracle_main([*again, "--overwrite"]) == 0
    assert '"episodes": 1' in (tmp_path / "report.json").read_text()
    decoy = tmp_path.parent / "notes"
    decoy.mkdir()
    (decoy / "thesis.tex").write_text("mine")
    assert oracle_main([*again[:-1], str(decoy), "--overwrite"]) == 2  # not an evaluation folder: untouched
    assert (decoy / "thesis.tex").read_text() == "mine" and "nothing was deleted" in capsys.readouterr().err
    assert oracle_main(["--split", "nope", "--no-progress"]) == 2
    assert "unknown ALFWorld split" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("split", "games"), [("valid_seen", 140), ("valid_unseen", 134)])
def test_oracle_wins_every_game(split: str, games: int) -> None:
    """About 2 minutes per split on 2 cores (two worker processes)."""
    report, results = run_oracle(split, workers=2, concurrency=2, progress=False)
    losses = [r.game for r in results if not r.won]
    assert losses == []
    assert (report.overall.episodes, report.overall.successes, report.overall.errors) == (games, games, 0)
    assert list(report.per_task)[:6] == list(TASK_TYPES.values())
    assert sum(s.games for s in report.per_task.values()) == games
    assert all(s.games > 0 and s.success_rate == 1.0 for s in report.per_task.values())
    assert all(0 < r.steps < 50 for r in results)
