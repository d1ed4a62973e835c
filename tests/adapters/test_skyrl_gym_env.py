"""skyrl_gym/<ID> against SkyRL-gym (skyrl-gym) itself: its own gsm8k envs grade the replies, rows in SkyRL's layout."""

from __future__ import annotations

import json

import pytest

import agentenv
from agentenv.checker import check_env
from agentenv.errors import ConfigError, DataError, EnvNotFound, ResetNeeded
from agentenv.rollout.episode import RolloutConfig, run_episode
from tests.fakes import CharRenderer, ScriptedEngine

pytest.importorskip("skyrl_gym", reason="skyrl-gym is not installed (pip install 'agentenv[skyrl]'; "
                                        "scripts/install.sh --all)")
from agentenv.adapters.skyrl_gym_env import SkyRLGymEnv, listed_ids  # noqa: E402

SYSTEM = "Solve the problem. End with '#### ANSWER'."
QUESTIONS = [("Tom has 3 apples and buys 4 more. How many apples?", "7"),
             ("A box holds 12 eggs. How many eggs are in 6 boxes?", "72"),
             ("Sara reads 15 pages a day. How many pages in 4 days?", "60")]


def row(question: str, answer: str, index: int, **extra) -> dict:
    """One task in SkyRL's dataset layout (what its gsm8k preprocessing script writes)."""
    return {"data_source": "openai/gsm8k", "env_class": "gsm8k",
            "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
            "reward_spec": {"method": "rule", "ground_truth": answer},
            "extra_info": {"split": "test", "index": index}, **extra}


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps(row(q, a, i)) + "\n" for i, (q, a) in enumerate(QUESTIONS)))
    return path


async def test_gsm8k_rows_are_played_and_graded_by_skyrl(data) -> None:
    env = agentenv.make("skyrl_gym/gsm8k", data=str(data))
    assert type(env) is SkyRLGymEnv
    assert env.tasks().ids == ("gsm8k/0", "gsm8k/1", "gsm8k/2") and set(env.tasks().kinds) == {"openai/gsm8k"}
    obs, info = await env.reset(options={"task": 1})
    assert obs == QUESTIONS[1][0] and env.system_prompt == SYSTEM and info["task_id"] == "gsm8k/1"
    r = await env.step("12 eggs times 6 boxes is 72.\n#### 72")
    assert (r.reward, r.terminated, r.truncated, r.observation) == (1.0, True, False, "")
    assert r.info["task_id"] == "gsm8k/1" and r.info["skyrl_metrics"] == {}
    with pytest.raises(ResetNeeded):
        await env.step("#### 72")
    await env.reset(options={"task": 1})
    assert (await env.step("#### 71")).reward == 0.0  # SkyRL's strict match: the number after ####
    await env.reset(options={"task": 1})
    assert (await env.step("the answer is 72")).reward == 0.0  # no '#### ' mark: SkyRL gives 0
    await env.close()


async def test_multi_turn_rewards_and_messages_are_skyrls(tmp_path) -> None:
    """gsm8k_multi_turn: a well-formed wrong answer earns SkyRL's format share and its next message."""
    path = tmp_path / "mt.jsonl"
    path.write_text(json.dumps(row(*QUESTIONS[0], 0, env_class="gsm8k_multi_turn", max_turns=2)) + "\n")
    async with agentenv.make("skyrl_gym/gsm8k_multi_turn", data=str(path)) as env:
        await env.reset(options={"task": 0})
        first = await env.step("#### 8")
        assert first.reward == pytest.approx(0.2 / 2) and not first.terminated  # format score / max_turns
        assert first.observation.startswith("Now provide only the final numeric answer")  # the last turn's ask
        second = await env.step("#### 7")
        assert (second.reward, second.terminated) == (1.0, True)
        assert second.info["skyrl_metrics"] == {"steps": 2}


async def test_seeded_resets_draw_rows_reproducibly(data) -> None:
    env = agentenv.make("skyrl_gym/gsm8k", data=str(data), num_tasks=2)
    assert len(env.tasks()) == 2
    drawn = [(await env.reset(seed=s))[1]["task_id"] for s in range(8)]
    again = [(await env.reset(seed=s))[1]["task_id"] for s in range(8)]
    assert drawn == again and set(drawn) <= {"gsm8k/0", "gsm8k/1"} and len(set(drawn)) == 2


async def test_passes_agentenvs_contract_checker(data) -> None:
    report = await check_env(agentenv.make("skyrl_gym/gsm8k", data=str(data)), actions=["#### 7", "#### 60"])
    assert "tasks_by_index" in report.checks and report.checks[-1] == "close_twice" and not report.notes


def test_parquet_rows_as_pandas_writes_them(tmp_path) -> None:
    pandas = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow", reason="pandas reads parquet with pyarrow")
    path = tmp_path / "gsm8k.parquet"
    pandas.DataFrame([row(q, a, i) for i, (q, a) in enumerate(QUESTIONS)]).to_parquet(path)
    env = SkyRLGymEnv("gsm8k", data=path)
    assert env.tasks().ids == ("gsm8k/0", "gsm8k/1", "gsm8k/2")


def test_listed_ids_are_skyrls_registry() -> None:
    assert {"gsm8k", "gsm8k_multi_turn", "aime", "text2sql"} <= set(listed_ids())


def test_bad_input_is_refused_with_what_is_wrong(data, tmp_path) -> None:
    with pytest.raises(EnvNotFound):
        agentenv.make("skyrl_gym/no_such_env", data=str(data))
    with pytest.raises(ConfigError, match="pass data=PATH"):
        agentenv.make("skyrl_gym/gsm8k")
    with pytest.raises(ConfigError, match="does not exist"):
        SkyRLGymEnv("gsm8k", data=tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=".jsonl or .parquet"):
        SkyRLGymEnv("gsm8k", data=data.rename(tmp_path / "rows.csv"))
    cases = {
        "other env": (row("q", "1", 0, env_class="aime"), "env_class 'aime' is not 'gsm8k'"),
        "no prompt": ({"env_class": "gsm8k", "reward_spec": {"ground_truth": "1"}}, "no 'prompt' field"),
        "two users": (row("q", "1", 0, prompt=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
                      r"roles \['user', 'user'\]"),
    }
    for name, (bad, message) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(DataError, match=message):
            SkyRLGymEnv("gsm8k", data=path)
    path = tmp_path / "broken.jsonl"
    path.write_text('{"prompt": "q"}\n{not json\n')
    with pytest.raises(DataError, match=r"broken.jsonl:2: not JSON"):
        SkyRLGymEnv("gsm8k", data=path)


async def test_an_episode_through_the_rollout_loop_sums_skyrls_rewards(tmp_path) -> None:
    """run_episode plays SkyRL's multi-turn env unchanged: its message comes back as a user turn; return = sum."""
    path = tmp_path / "mt.jsonl"
    path.write_text(json.dumps(row(*QUESTIONS[0], 0, env_class="gsm8k_multi_turn", max_turns=2)) + "\n")
    cfg = RolloutConfig(max_turns=5, max_new_tokens_per_turn=20, max_total_tokens=200)
    async with agentenv.make("skyrl_gym/gsm8k_multi_turn", data=str(path)) as env:
        traj = await run_episode(env, ScriptedEngine(["#### 8", "#### 7"]), CharRenderer(), cfg, seed=0,
                                 options={"task": 0})
    text = CharRenderer().decode(traj.token_ids)
    assert traj.reward == pytest.approx(0.1 + 1.0) and traj.info["turns"] == 2 and traj.task_id == "gsm8k_multi_turn/0"
    assert text.startswith(f"U:{QUESTIONS[0][0]}\nA:#### 8") and "U:Now provide only the final numeric answer" in text
