"""verifiers/<NAME> against the real verifiers package, in its own Python environment.

The environment (tests/adapters/verifiers_envs/agentenv_vf_add.py: a verifiers ToolEnv with an ``add``
tool and a rubric) is written against verifiers' public API and loaded by the runner under
.venv-verifiers's interpreter (scripts/install_verifiers.sh); agentenv's side imports nothing of
verifiers. The model is scripted, so what is checked is the plumbing: verifiers' own loop sends its
prompt and tool schema through the endpoint, runs the tool the policy called, and its rubric's score
becomes the episode's reward, with every token in the row.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

import agentenv
from agentenv.adapters import verifiers_env
from agentenv.adapters.verifiers_env import VerifiersEnv, resolve
from agentenv.errors import ConfigError
from agentenv.rollout.episode import RolloutConfig, run_episode_samples
from tests.agents.test_endpoint import assert_exact
from tests.agents.test_endpoint_stream import ScriptedReplies
from tests.agents.tiny import tool_renderer

REPO = Path(__file__).resolve().parents[2]
PYTHON = Path(os.environ.get(verifiers_env.PYTHON_VAR, REPO / ".venv-verifiers" / "bin" / "python"))
ENVS = Path(__file__).with_name("verifiers_envs")
NAME = "agentenv-vf-add"
CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'

pytestmark = [pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def verifiers_python(monkeypatch):
    """.venv-verifiers as the default interpreter, the test environment's folder on its path."""
    if not PYTHON.is_file():
        pytest.skip(f"no verifiers environment at {PYTHON} (bash scripts/install_verifiers.sh; "
                    "scripts/install.sh --all makes it)")
    monkeypatch.setenv(verifiers_env.PYTHON_VAR, str(PYTHON))
    monkeypatch.setenv("PYTHONPATH", str(ENVS))


def cfg() -> RolloutConfig:
    return RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=800)


async def play(env, replies, task):
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, replies)
    samples = await run_episode_samples(env, engine, renderer, cfg(), seed=0, options={"task": task})
    return samples, engine, renderer


async def test_a_tool_call_runs_in_verifiers_and_its_rubric_is_the_reward():
    env = agentenv.make(f"verifiers/{NAME}")
    assert type(env) is VerifiersEnv and env.tasks().ids == (f"{NAME}/train-0", f"{NAME}/train-1", f"{NAME}/train-2")
    samples, engine, renderer = await play(env, [CALL, "The sum is 5."], task=0)  # row 0: 2 + 3
    (row,) = samples
    assert (row.status, row.reward) == ("completed", 1.0)
    assert row.info["tool_calls"] == 1 and row.info["turns"] == 2
    # the rubric's functions, and the metrics verifiers' ToolEnv adds of its own
    assert row.info["verifiers_metrics"] == {"correct": 1.0, "tool_calls": 1.0, "add_calls": 1.0,
                                             "total_tool_calls": 1.0, "num_turns": 2.0}
    assert_exact(env.last_session, samples)
    first_prompt = renderer.decode(engine.prompts[0], keep_special=True)
    assert "Use the add tool, then state the sum." in first_prompt and "What is 2 + 3?" in first_prompt
    assert '"name": "add"' in first_prompt  # verifiers' tool schema reached the chat template
    second = renderer.decode(engine.prompts[1][len(engine.prompts[0]):])
    assert "5" in second  # verifiers ran add(2, 3) and sent the result back as the tool message
    wrong, _, _ = await play(env, [CALL, "The sum is 6."], task=0)
    assert (wrong[0].status, wrong[0].reward) == ("completed", 0.0)
    await env.close()


async def test_the_eval_split_and_concurrent_episodes_share_one_process():
    envs = [VerifiersEnv(NAME, split="eval") for _ in range(2)]
    assert envs[0].tasks().ids == (f"{NAME}/eval-0", f"{NAME}/eval-1")
    results = await asyncio.gather(play(envs[0], ["42"], task=0), play(envs[1], ["3"], task=1))  # 20 + 22; 1 + 1
    assert [r[0][0].reward for r in results] == [1.0, 0.0]
    assert envs[0]._runner is envs[1]._runner and envs[0]._runner.users == 2
    proc = envs[0]._runner.proc
    for env in envs:
        await env.close()
    assert proc.returncode == 0  # the last user's close ended it
    assert not verifiers_env._runners[asyncio.get_running_loop()]


class KillsTheRunner(ScriptedReplies):
    """Kills the env's runner process while its rollout waits for this reply."""

    def __init__(self, renderer, replies, env) -> None:
        super().__init__(renderer, replies)
        self.env = env

    async def generate(self, prompt_ids, params):
        self.env._runner.proc.kill()
        await self.env._runner.proc.wait()
        return await super().generate(prompt_ids, params)


async def test_a_process_that_dies_fails_its_episode_and_the_next_one_starts_anew():
    env = VerifiersEnv(NAME, num_tasks=1)
    assert len(env.tasks()) == 1
    (ok,), _, _ = await play(env, ["5"], task=0)
    assert ok.reward == 1.0
    renderer = tool_renderer()
    (failed,) = await run_episode_samples(env, KillsTheRunner(renderer, ["5"], env), renderer, cfg(),
                                          seed=0, options={"task": 0})
    assert failed.status == "error" and "verifiers runner exited" in failed.info["error"]  # replayed, not 0
    (again,), _, _ = await play(env, ["5"], task=0)  # a new process
    assert (again.status, again.reward) == ("completed", 1.0)
    env._runner.proc.kill()  # dead between episodes: the next request starts a new one, nothing fails
    await env._runner.proc.wait()
    (after_idle,), _, _ = await play(env, ["5"], task=0)
    assert (after_idle.status, after_idle.reward) == ("completed", 1.0)
    await env.close()


async def test_a_spent_token_budget_truncates_with_reward_zero():
    env = VerifiersEnv(NAME)
    renderer = tool_renderer()
    engine = ScriptedReplies(renderer, [CALL, CALL, CALL])
    # a call is 32 tokens, the tool's answer 25 (the budget counts what follows the first prompt): the third
    # request finds 32 + 25 + 32 + 25 = 114 > 100 tokens spent and is refused; verifiers ends the rollout
    tight = RolloutConfig(max_turns=4, max_new_tokens_per_turn=64, max_total_tokens=100)
    (row,) = await run_episode_samples(env, engine, renderer, tight, seed=0, options={"task": 0})
    assert (row.status, row.reward, row.info["truncation"]) == ("completed", 0.0, "max_total_tokens")
    assert row.info["turns"] == 2 and "token budget is spent" in row.info["agent_error"]
    await env.close()


def test_bad_configuration_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no Python at"):
        VerifiersEnv(NAME, python=tmp_path / "python")
    with pytest.raises(ConfigError, match="does not load.*this environment was asked to fail"):
        VerifiersEnv(NAME, env_args={"boom": True})
    with pytest.raises(ConfigError, match="does not load.*not-installed-anywhere"):
        VerifiersEnv("not-installed-anywhere")
    with pytest.raises(ConfigError, match="split must be"):
        VerifiersEnv(NAME, split="test")


def test_ids():
    assert resolve("verifiers/my-env") == {"name": "my-env"}
    assert resolve("verifiers/org/my-env") == {"name": "org/my-env"}
    assert resolve("verifiers/") is None and resolve("verifiers/a/b/c") is None and resolve("verifiers/a/") is None
    assert json.loads(verifiers_env._argv(PYTHON, NAME, {"b": 1, "a": 2})[-1]) == {"a": 2, "b": 1}
