"""``agentenv train --env alfworld``: one real asynchronous update of the embedded default model on
ALFWorld's train games (recipe ``alfworld_cpu``, shrunk budgets). Budget: about 45 s on 2 cores
(model load ~10 s, four short episodes of ~450-token prompts, the train split listed from the cache;
the first use extracts it, ~4 s)."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("alfworld", reason="the alfworld package is not installed (scripts/install_alfworld.sh)")

from agentenv.trainer.recipe import main  # noqa: E402

pytestmark = [pytest.mark.alfworld, pytest.mark.slow]


def test_one_update_on_alfworld_train_games_with_the_default_model(tmp_path):
    run = tmp_path / "run"
    argv = ["--env", "alfworld", "--run-dir", str(run), "--updates", "1", "run.batch_size=2",
            "run.concurrency=2", "run.max_pool_size=4", "rollout.max_turns=2",
            "rollout.max_new_tokens_per_turn=12",
            # the plumbing is under test: the update steps although two lost games carry no gradient
            "optim.step_on_zero_gradient=true"]
    assert main(argv) == 0
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    assert cfg["env"]["id"] == "alfworld" and cfg["warmup"]["steps"] == 0
    assert cfg["learner"]["backend"] == "single"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1]
    assert rows[0]["episodes/errors"] == 0 and 1 <= rows[0]["length/turns"] <= 2
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 2  # B = 2 games per update
    for c in consumed:
        assert c["task_id"].startswith("train/") and c["version"] == 0 and c["reward"] in (0.0, 1.0)
        assert 1 <= c["turns"] <= 2 and 1 <= c["policy_tokens"] <= 24
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 1 and not summary["interrupted"]
    assert (run / "checkpoints" / "latest").read_text().strip().startswith("v00000001")
