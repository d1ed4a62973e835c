"""``agentenv eval`` as a user runs it: the held-out protocol by default, reports that keep each episode as it
ends (``--resume``), seeds for an env without a task list, exit statuses, and a folder it may not replace."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path

import pytest

import agentenv
from agentenv import eval_command
from agentenv.engines.build import ModelConfig
from agentenv.errors import EngineError
from agentenv.eval_command import EvalArgs, main, parse_args
from agentenv.evaluation import EvalConfig
from agentenv.registration import EnvSpec
from agentenv.rollout.episode import RolloutConfig
from tests.fakes import CharRenderer, ScriptedEngine
from tests.tiny_env import RepeatNumberEnv


class CountingEngine(ScriptedEngine):
    """A scripted engine that records the sampling temperature of each request."""

    def __init__(self, replies, **kw):
        super().__init__(replies, **kw)
        self.temperatures = []

    async def generate(self, prompt_ids, params):
        self.temperatures.append(params.temperature)
        return await super().generate(prompt_ids, params)


def use_engine(monkeypatch, engine):
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (engine, CharRenderer()))


def said(capsys) -> str:
    """What the command wrote on stderr, on one line (tyro draws its messages in a box)."""
    return " ".join(capsys.readouterr().err.replace("\u2502", " ").split())


REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(REPO.glob("examples/*/README.md"))]


def test_the_defaults_are_the_training_configs_values():
    args = parse_args([])
    assert args == EvalArgs()
    model, held_out, rollout = ModelConfig(), EvalConfig(), RolloutConfig()
    assert (args.model, args.engine, args.gpu_memory_utilization) == (model.name, model.engine, model.memory_share)
    assert (args.model, args.engine, args.gpu_memory_utilization) == (None, "transformers", None)
    assert (args.temperature, args.concurrency) == (held_out.temperature, held_out.concurrency) == (0.0, 8)
    assert args.samples_per_game == 1  # one episode per task, as training's held-out evaluation plays
    assert (args.max_new_tokens, args.top_p) == (rollout.max_new_tokens_per_turn, rollout.top_p) == (256, 1.0)


def test_a_repeated_flag_adds_up_in_either_spelling():
    args = parse_args(["--env-arg", "high=3", "--env-arg=low=1", "--remote", "http://a:1", "--remote", "http://b:2",
                       "--chat-template-kwarg", "enable_thinking=false", "--no-progress", "--resume"])
    assert args.env_arg == ("high=3", "low=1") and args.remote == ("http://a:1", "http://b:2")
    assert eval_command.template_kwargs(args) == {"enable_thinking": False}
    assert (args.no_progress, args.resume, args.overwrite) == (True, True, False)


@pytest.mark.parametrize(("argv", "message"), [
    (["--temperature", "-1"], "--temperature -1.0: expected a finite number >= 0"),
    (["--top-p", "1.5"], "--top-p 1.5: expected a number in (0, 1]"),
    (["--samples-per-game", "0"], "--samples-per-game 0: expected an integer >= 1"),
    (["--concurrency", "0"], "--concurrency 0: expected an integer >= 1"),
    (["--max-total-tokens", "-5"], "--max-total-tokens -5: expected an integer >= 1"),
    (["--transcripts", "-1"], "--transcripts -1: expected an integer >= 0"),
    (["--gpu-memory-utilization", "2"], "--gpu-memory-utilization 2.0: expected a number in (0, 1]"),
    (["--seeds", "8:5"], "--seeds '8:5': expected A:B with 0 <= A < B"),
    (["--concurrency", "four"], "--concurrency: invalid literal for int() with base 10: 'four'"),
    (["--engine", "tgi"], "invalid choice 'tgi' for argument '--engine'"),
    (["--temprature", "1"], "Unrecognized options: --temprature"),
])
def test_a_bad_flag_or_value_exits_2_naming_it_before_anything_is_written(argv, message, tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--env", "tests/Repeat-v0", *argv]) == 2
    assert message in said(capsys)
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_option(capsys):
    assert main(["--help"]) == 0
    shown = capsys.readouterr().out
    flags = ["--" + f.name.replace("_", "-") for f in dataclasses.fields(EvalArgs)]
    assert [f for f in flags if f not in shown] == [] and len(flags) == 24


def documented_commands() -> list[tuple[str, str, bool]]:
    """``(file, arguments, whole)`` of every ``agentenv eval`` in the docs: code-block lines (whole commands)
    and inline code (which may name a flag alone, e.g. `agentenv eval --model`); synopses with [...] left out."""
    found = []
    for path in DOCS:
        text = path.read_text().replace("\\\n", " ")
        where = str(path.relative_to(REPO))
        found += [(where, c, True) for c in re.findall(r"^(?:\.venv/bin/)?agentenv eval\s(.*)$", text, re.M)]
        found += [(where, c, False) for c in re.findall(r"`(?:\.venv/bin/)?agentenv eval\s([^`]*)`", text)
                  if "[" not in c]
    return found


def test_every_documented_eval_command_reads():
    commands = documented_commands()
    assert {f for f, _, whole in commands if whole} >= {"docs/cli.md", "docs/environments.md", "docs/remote.md",
                                                         "docs/tutorial_own_env.md", "examples/guess_number/README.md"}
    flags = {"--help", *("--" + f.name.replace("_", "-") for f in dataclasses.fields(EvalArgs))}
    for where, command, whole in commands:
        words = shlex.split(command, comments=True)
        if whole:
            parse_args(words)  # a SystemExit here names the file's command that no longer reads
        assert {w.partition("=")[0] for w in words if w.startswith("--")} <= flags, (where, command)


def test_the_default_protocol_is_the_held_out_one_and_the_report_states_it(guess_number, monkeypatch, tmp_path,
                                                                         capsys):
    engine = CountingEngine(["1"])  # GuessNumber(high=3): "1" wins secret-1 at once, never the others
    use_engine(monkeypatch, engine)
    out = tmp_path / "eval"
    assert main(["--env", guess_number, "--env-arg", "high=3", "--no-progress", "--out", str(out),
                 "--transcripts", "2"]) == 0
    report = json.loads((out / "report.json").read_text())
    proto = report["protocol"]
    assert (proto["sampling"], proto["samples_per_task"], proto["tasks"]) == ("greedy", 1, "first 3 of 3 tasks")
    assert proto["max_new_tokens_per_turn"] == 256 and proto["max_total_tokens"] == "model context"
    assert proto["max_turns"] == "the env's own, at most 50"
    assert set(engine.temperatures) == {0.0} and report["complete"] is True
    episodes = report["episodes"]
    assert [e["game"] for e in episodes] == ["secret-1", "secret-2", "secret-3"]  # one sample each
    assert [e["transcript"] is not None for e in episodes] == [True, True, False]  # the first 2 only
    assert episodes[0]["transcript"].startswith("U:") and "A:1<EOT>" in episodes[0]["transcript"]
    assert report["overall"]["endings"] == {"truncated": 2, "won": 1}
    lines = (out / "episodes.jsonl").read_text().splitlines()
    assert sorted(json.loads(x)["game"] for x in lines) == ["secret-1", "secret-2", "secret-3"]
    table = capsys.readouterr().out
    assert "episodes ended: 2 truncated, 1 won" in table and "sampling=greedy" in table


def test_resume_plays_only_what_was_not_recorded(guess_number, monkeypatch, tmp_path, capsys):
    out = tmp_path / "eval"
    argv = ["--env", guess_number, "--env-arg", "high=3", "--no-progress", "--out", str(out)]
    use_engine(monkeypatch, ScriptedEngine(["1"]))
    assert main(argv) == 0
    # as if killed after the first episode: its line is all the folder keeps of the run
    first = (out / "episodes.jsonl").read_text().splitlines()[0]
    (out / "episodes.jsonl").write_text(first + "\n")
    proto = json.loads((out / "report.json").read_text())["protocol"]
    (out / "report.json").write_text(json.dumps({"protocol": proto, "complete": False}))
    assert main(argv) == 2  # the folder holds an evaluation: neither replaced nor continued unasked
    assert "pass --overwrite to replace it or --resume to continue it" in capsys.readouterr().err
    assert main([*argv, "--resume", "--temperature", "1.0"]) == 2
    assert "another protocol (sampling: 'greedy' then, 'temperature 1.0, top_p 1.0' now)" in capsys.readouterr().err
    engine = CountingEngine(["1"])
    use_engine(monkeypatch, engine)
    assert main([*argv, "--resume"]) == 0
    assert "1 of 3 episodes recorded before; playing the other 2" in capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    assert [e["game"] for e in report["episodes"]] == ["secret-1", "secret-2", "secret-3"]
    assert report["overall"]["episodes"] == 3 and len((out / "episodes.jsonl").read_text().splitlines()) == 3
    played_now = len(engine.temperatures)
    assert played_now == 14  # secrets 2 and 3 never guessed: 7 turns each (GuessNumber's own max_turns)


def test_an_env_without_a_task_list_is_played_over_seeds(monkeypatch, tmp_path):
    repeat = EnvSpec("tests/Repeat-v0", "tests.tiny_env:RepeatNumberEnv")
    monkeypatch.setitem(agentenv.registry, "tests/Repeat-v0", repeat)
    seen = []
    from tests.tiny_env import RepeatNumberEnv

    async def reset(self, *, seed=None, options=None):
        seen.append((seed, options))
        return await original(self, seed=seed, options=options)

    original = RepeatNumberEnv.reset
    monkeypatch.setattr(RepeatNumberEnv, "reset", reset)
    use_engine(monkeypatch, ScriptedEngine(["7"]))
    out = tmp_path / "eval"
    assert main(["--env", "tests/Repeat-v0", "--seeds", "5:8", "--no-progress", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["protocol"]["tasks"] == "seeds 5:8"
    assert sorted(e["game"] for e in report["episodes"]) == ["seed-5", "seed-6", "seed-7"]
    assert sorted(s for s, _ in seen if s is not None) == [5, 6, 7] and all(o is None for _, o in seen)
    assert eval_command.DEFAULT_SEEDS.start >= 2_000_000_000  # training with run.seed < 1,999 never plays these
    assert main(["--env", "tests/Repeat-v0", "--seeds", "8:5", "--out", str(tmp_path / "x")]) == 2


class ParserRepeatEnv(RepeatNumberEnv):
    """RepeatNumberEnv that takes a ``tool_parser`` argument and records what it was built with."""

    built: list = []

    def __init__(self, high: int = 100, tool_parser: str = "hermes") -> None:
        super().__init__(high)
        self.built.append(tool_parser)


class QwenCharRenderer(CharRenderer):
    tool_parser_name = "qwen3"


@pytest.mark.parametrize(("given", "expected"), [([], "qwen3"), (["--env-arg", "tool_parser=mistral"], "mistral")])
def test_the_tool_parser_comes_from_the_model_template_unless_given(monkeypatch, tmp_path, capsys, given, expected):
    monkeypatch.setitem(agentenv.registry, "tests/ParserRepeat-v0", EnvSpec("tests/ParserRepeat-v0", ParserRepeatEnv))
    monkeypatch.setattr(ParserRepeatEnv, "built", [])
    monkeypatch.setattr(eval_command, "_build_engine", lambda args: (ScriptedEngine(["7"]), QwenCharRenderer()))
    argv = ["--env", "tests/ParserRepeat-v0", "--seeds", "0:2", "--no-progress", "--out", str(tmp_path / "e"), *given]
    assert main(argv) == 0
    # the env read for its task list, before the model loads: its default, or the user's argument
    assert ParserRepeatEnv.built[0] == ("mistral" if given else "hermes")
    assert set(ParserRepeatEnv.built[1:]) == {expected} and len(ParserRepeatEnv.built) >= 3
    said = "tool_parser='qwen3', from the model's chat template" in capsys.readouterr().err
    assert said == (not given)


def test_every_episode_failing_exits_1_with_the_reason(guess_number, monkeypatch, tmp_path, capsys):
    class Broken(ScriptedEngine):
        async def generate(self, prompt_ids, params):
            raise EngineError("CUDA out of memory")

    use_engine(monkeypatch, Broken(["1"]))
    out = tmp_path / "eval"
    assert main(["--env", guess_number, "--env-arg", "high=3", "--no-progress", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "agentenv eval: all 3 episodes failed (the first: EngineError: CUDA out of memory)" in err
    assert json.loads((out / "report.json").read_text())["overall"]["errors"] == 3


@pytest.mark.parametrize("extra", [[], ["--overwrite"], ["--resume"]])
def test_a_folder_of_user_files_is_never_written_or_deleted(guess_number, monkeypatch, tmp_path, capsys, extra):
    use_engine(monkeypatch, ScriptedEngine(["1"]))
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("chapter one")
    assert main(["--env", guess_number, "--env-arg", "high=3", "--no-progress", "--out", str(mine), *extra]) == 2
    assert "is not an agentenv evaluation folder" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["thesis.tex"] and (mine / "thesis.tex").read_text() == "chapter one"


def test_bad_input_writes_no_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["--split", "valid_train", "--no-progress"]) == 2
    assert not (tmp_path / "runs").exists()


def test_the_default_folder_is_named_after_the_env(guess_number, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    use_engine(monkeypatch, ScriptedEngine(["1"]))
    assert main(["--env", guess_number, "--env-arg", "high=2", "--no-progress"]) == 0
    assert (tmp_path / "runs" / "eval" / "examples_GuessNumber-v0" / "report.json").is_file()


_INTERRUPTED = """
import asyncio, sys
sys.path.insert(0, {repo!r}); sys.path.insert(0, {plugin!r})
import agentenv_guess_number; agentenv_guess_number.register_envs()
from agentenv import eval_command
from tests.fakes import CharRenderer, ScriptedEngine
from tests.tiny_env import RepeatNumberEnv

class Slow(ScriptedEngine):
    async def generate(self, prompt_ids, params):
        if len(self.calls) >= 2:  # the first episode wins at once; then every reply waits
            print("first episode done", flush=True)
            await asyncio.sleep(60)
        return await super().generate(prompt_ids, params)

eval_command._build_engine = lambda args: (Slow(["1"]), CharRenderer())
sys.exit(eval_command.main(["--env", "examples/GuessNumber-v0", "--env-arg", "high=3", "--no-progress",
                            "--concurrency", "1", "--out", {out!r}]))
"""


def test_ctrl_c_keeps_the_episodes_that_ended_and_resume_plays_the_rest(guess_number, monkeypatch, tmp_path):
    import signal
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "eval"
    code = _INTERRUPTED.format(repo=str(repo), plugin=str(repo / "examples" / "guess_number"), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "first episode done"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 130 and "--resume plays the rest" in err and "Traceback" not in err
    assert [json.loads(x)["game"] for x in (out / "episodes.jsonl").read_text().splitlines()] == ["secret-1"]
    engine = CountingEngine(["1"])
    use_engine(monkeypatch, engine)
    assert main(["--env", guess_number, "--env-arg", "high=3", "--no-progress", "--concurrency", "1",
                 "--out", str(out), "--resume"]) == 0
    assert [e["game"] for e in json.loads((out / "report.json").read_text())["episodes"]] == [
        "secret-1", "secret-2", "secret-3"]
    assert len(engine.temperatures) == 14  # only secrets 2 and 3 played again, 7 guesses each
