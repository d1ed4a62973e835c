"""Held-out evaluation: exact success rates on real math500 problems with a scripted answerer."""

from __future__ import annotations

import pytest

from agentenv.engines.base import GenerationOutput, SamplingParams, TokenSpan
from agentenv.envs.python_tool.datasets import load_math
from agentenv.errors import ConfigError
from agentenv.trainer import setup
from agentenv.trainer.config import EvalConfig, TrainConfig
from agentenv.trainer.heldout import evaluate_held_out, held_out_tasks
from agentenv.trainer.recipe import parse_args
from tests.fakes import EOT, CharRenderer


class AnswerEvenProblems:
    """Reads the problem from the prompt; boxes the right answer for even-numbered held-out problems."""

    def __init__(self, problems, version: int = 4):
        self.problems = problems
        self.version = version
        self.max_context_tokens = 100_000
        self.temperatures: list[float] = []

    async def generate(self, prompt_ids, params: SamplingParams) -> GenerationOutput:
        self.temperatures.append(params.temperature)
        text = "".join(chr(i) for i in prompt_ids)
        index = next(i for i, p in enumerate(self.problems) if p.problem[:250] in text)
        reply = f"\\boxed{{{self.problems[index].answer}}}" if index % 2 == 0 else "\\boxed{no idea}"
        ids = [ord(c) for c in reply] + [EOT]
        return GenerationOutput(ids, [0.0] * len(ids), [TokenSpan(len(ids), self.version, self.version)])


def _cfg(n: int, **eval_kw) -> TrainConfig:
    cfg, _ = parse_args(["env.kwargs.sandbox_backend=process", f"eval.problems={n}", "env.kwargs.dataset=math_train",
                         "env.eval_kwargs.dataset=math500", "env.kwargs.max_problem_chars=80"])
    return cfg if not eval_kw else TrainConfig(**{**cfg.__dict__, "eval": EvalConfig(problems=n, **eval_kw)})


async def test_held_out_problems_are_the_first_short_math500_ones_and_not_training_problems():
    cfg = _cfg(7)
    factory, tasks = await held_out_tasks(cfg)
    short = [p for p in load_math("math500") if len(p.problem) <= 80]
    assert tasks.ids == tuple(p.id for p in short[:7])
    assert tasks.kinds[0] == short[0].id.split("/")[-2] != ""  # the MATH subject
    train_texts = {p.problem for p in load_math("math_train")}
    assert not any(p.problem in train_texts for p in short[:7])
    env = factory()  # env.kwargs with env.eval_kwargs over them: the training filter applies too
    assert env.problems == tuple(short) and env.max_turns == cfg.rollout.max_turns == 2
    assert env.sandbox_backend == "process"
    obs, info = await env.reset(options={"task": 6})
    assert info["task_id"] == tasks.ids[6] and obs.startswith(short[6].problem)
    await env.close()


async def test_success_rate_counts_exactly_the_correct_answers():
    cfg = _cfg(5, concurrency=3)
    _, tasks = await held_out_tasks(cfg)
    problems = {p.id: p for p in load_math("math500")}
    engine = AnswerEvenProblems([problems[i] for i in tasks.ids])
    report = await evaluate_held_out(cfg, engine, CharRenderer(), label="after", samples_per_task=2)
    # problems 0, 2, 4 answered right, twice each: 6 of 10 episodes
    assert (report.tasks, report.episodes, report.errors) == (5, 10, 0)
    assert report.success_rate == pytest.approx(0.6)
    assert report.version == 4 and report.turns_mean == 1.0 and report.tool_calls_mean == 0.0
    assert set(engine.temperatures) == {0.0}  # greedy by default
    # per-task outcomes, in task order, pair up between two reports of a run
    assert report.task_ids == tasks.ids and report.outcomes == (1.0, 0.0, 1.0, 0.0, 1.0)


async def test_the_default_recipe_holds_out_200_procedural_tasks_disjoint_from_training():
    cfg, _ = parse_args([])
    assert cfg.env.kwargs == {"dataset": "tool_expr_train", "max_turns": 2, "sandbox_backend": "auto",
                              "trailing_text": "error"}
    assert (cfg.env.eval_kwargs, cfg.eval.problems) == ({"dataset": "tool_expr_eval"}, 200)
    _, tasks = await held_out_tasks(cfg)
    held = {p.id: p.problem for p in load_math("tool_expr_eval")}
    assert len(tasks) == 200 and len({held[i] for i in tasks.ids}) == 200
    train_texts = {p.problem for p in load_math("tool_expr_train")}
    assert not train_texts & {held[i] for i in tasks.ids}
    assert set(tasks.kinds) == {"basic_arithmetic"}
    assert tasks.kinds == tuple(i.split("/")[1] for i in tasks.ids)


async def test_the_shipped_cpu_recipe_holds_out_the_first_200_tool_expr_eval_problems_in_order():
    """BENCHMARKS.md's learning figures were measured on these 200 problems, in this order."""
    cfg, _ = parse_args(["--recipe", "python_tool_cpu"])
    factory, tasks = await held_out_tasks(cfg)
    assert tasks.ids == tuple(p.id for p in load_math("tool_expr_eval")[:200])
    env = factory()
    assert (env.max_turns, env.sandbox_backend) == (2, "auto")
    # and the training env plays the whole training set
    train = setup.env_factory(cfg)()
    assert train.problems == load_math("tool_expr_train") and train.max_turns == 2


def test_eval_config_and_training_temperature_are_checked():
    with pytest.raises(ConfigError, match="eval.problems"):
        EvalConfig(problems=-1)
    with pytest.raises(ConfigError, match="eval.temperature"):
        EvalConfig(temperature=float("nan"))
    with pytest.raises(ConfigError, match="rollout.temperature must be > 0"):
        parse_args(["rollout.temperature=0"])


async def test_an_env_without_tasks_has_no_held_out_evaluation(monkeypatch):
    import agentenv

    monkeypatch.setitem(agentenv.registry, "tests/Repeat-v0", agentenv.registration.EnvSpec(
        "tests/Repeat-v0", "tests.tiny_env:RepeatNumberEnv"))
    cfg, _ = parse_args(["--recipe", "generic_cpu", "--env", "tests/Repeat-v0", "eval.problems=2"])
    with pytest.raises(ConfigError, match=r"'tests/Repeat-v0' declares no fixed tasks .*set eval.problems=0"):
        await held_out_tasks(cfg)
    # the held-out env's arguments are checked like the training env's
    cfg, _ = parse_args(["--recipe", "generic_cpu", "--env", "tests/Repeat-v0", "eval.problems=2",
                         "env.eval_kwargs.split=valid"])
    with pytest.raises(ConfigError, match="does not take 'split'; it takes: high, max_tries"):
        await held_out_tasks(cfg)


@pytest.mark.alfworld
async def test_alfworld_held_out_games_are_the_first_unseen_ones():
    pytest.importorskip("alfworld", reason="ALFWorld is installed by scripts/install_alfworld.sh")
    from agentenv.envs.alfworld import list_games

    cfg, _ = parse_args(["--env", "alfworld", "eval.problems=3"])
    factory, tasks = await held_out_tasks(cfg)
    unseen = list_games("valid_unseen")[:3]
    assert tasks.ids == tuple(f"valid_unseen/{g.name}" for g in unseen)
    assert tasks.kinds == tuple(g.task_type for g in unseen)
    env = factory()
    assert env.split == "valid_unseen" and env.max_steps == cfg.rollout.max_turns == 4
