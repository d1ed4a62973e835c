"""An unmodified OpenAI-API agent program plus a reward function trains like any env: one real update.

``tests/agents/calc_agent.py`` (the ``openai`` package, its own loop and tool) is registered as an
:class:`agentenv.agents.AgentEnv`; the recipe's collector, pool, learner and engine are the real ones,
on a tiny random Llama over SmolLM2's tokenizer with the shipped tool template. The run is
asynchronous, so the weight update lands while agents are mid-episode.
"""

from __future__ import annotations

import json

import pytest

import agentenv
from agentenv.trainer import recipe, setup
from tests.agents import calc_agent
from tests.agents.tiny import tiny_smollm_lm, tool_renderer
from tests.smollm_tokenizer import smollm_tokenizer

pytestmark = [pytest.mark.timeout(300)]

ID = "tests/CalcAgent-v0"


@pytest.fixture
def calc_env():
    agentenv.register(ID, "agentenv.agents:AgentEnv", agent="tests.agents.calc_agent:solve",
                      reward="tests.agents.calc_agent:score", tasks="tests.agents.calc_agent:TASKS")
    yield ID
    agentenv.registry.pop(ID, None)


def test_train_an_agent_program(calc_env, tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "load_policy", lambda cfg, **_: (tiny_smollm_lm(), smollm_tokenizer(),
                                                                 tool_renderer()))
    run = tmp_path / "run"
    argv = ["--env", calc_env, "--run-dir", str(run), "run.updates=2", "run.batch_size=4", "run.concurrency=4",
            "run.max_pool_size=8", "rollout.max_new_tokens_per_turn=4", "rollout.max_total_tokens=400",
            "learner.micro_batch_size=4", "model.max_batch_size=4", "optim.step_on_zero_gradient=true",
            "eval.problems=2"]
    assert recipe.main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2] and all(r["episodes/errors"] == 0 for r in rows)
    assert all(r["chat/history_rewrites"] == 0 and r["length/turns"] == calc_agent.TURNS for r in rows)
    consumed = [json.loads(line) for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == 8 and {c["task_id"] for c in consumed} <= {t["id"] for t in calc_agent.TASKS}
    assert all(c["turns"] == calc_agent.TURNS and 0 < c["policy_tokens"] <= 4 * calc_agent.TURNS for c in consumed)
    # the second batch was consumed at version 1; its trajectories were sampled under versions 0..1
    assert {c["version"] for c in consumed} == {0, 1}
    for label, version in (("before", 0), ("after", 2)):
        report = json.loads((run / f"eval_{label}.json").read_text())
        assert report["task_ids"] == ["add-2-3", "add-4-5"] and report["version"] == version
        assert report["errors"] == 0 and report["turns_mean"] == calc_agent.TURNS
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] == 2 and not summary["interrupted"]
