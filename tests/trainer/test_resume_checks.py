"""--resume refuses what it cannot continue, naming the file: a checkpoint of another run or config, a
truncated checkpoint, a pool or run state of another format, logged updates without a checkpoint; and
it continues an older checkpoint and the task stream it records (trainer/resume.py).

``trainer.train.train()`` runs for real on the scripted model side of ``test_loop_failures`` (a few seconds
a run); the killed-process version of these checks is ``test_resume_kill.py``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
from dataclasses import replace

import pytest

from agentenv.errors import CheckpointError, DataError, RunFolderError
from agentenv.rollout.collector import RolloutCollector
from agentenv.rollout.episode import RolloutConfig
from agentenv.rollout.pool import TrajectoryPool
from agentenv.trainer import recipe
from agentenv.trainer import train as train_loop
from tests.fakes import CharRenderer, CountdownEnv, ScriptedEngine

from .test_loop_failures import OVERRIDES, scripted_parts

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, *extra, resume=False, name="run"):
    """``train()`` of ``tmp_path / name`` on the scripted model side, with :class:`SlowCountdownEnv`."""
    argv = ["--run-dir", str(tmp_path / name), *OVERRIDES, "run.checkpoint_every=1", *extra]
    cfg, args = recipe.parse_args(argv + (["--resume"] if resume else []))
    run_dir = recipe.prepare_run_dir(cfg, resume=resume, overwrite=False)
    if resume:
        cfg = recipe.resumed_config(run_dir, args.overrides)
    parts = replace(scripted_parts([]), env_factory=lambda cfg, *_: SlowCountdownEnv)
    return asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, resume=resume, parts=parts), 90))


class SlowCountdownEnv(CountdownEnv):
    """A step takes 20 ms, so an episode spans many turns of the event loop."""

    async def step(self, action):
        await asyncio.sleep(0.02)
        return await super().step(action)


@pytest.fixture
def trained(tmp_path):
    """A run of 2 updates with checkpoints v1 and v2; returns its checkpoint root.

    Episodes take 20 ms and the pool may hold 256, so admission never stops a worker: at every
    checkpoint each of the 4 workers is playing a task."""
    assert _run(tmp_path, "--updates", "2", "run.max_pool_size=256")["updates"] == 2
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "v00000001", "v00000002"]
    return root


def _edit_extra(ckpt, edit):
    meta = json.loads((ckpt / "meta.json").read_text())
    edit(meta["extra"])
    (ckpt / "meta.json").write_text(json.dumps(meta))


def test_resume_refuses_a_checkpoint_written_for_another_environment(tmp_path, trained):
    assert _run(tmp_path, "--updates", "3", resume=True)["updates"] == 3  # the same run continues
    config = (tmp_path / "run" / "config.yaml").read_text()
    with pytest.raises(RunFolderError, match=r"checkpoints/.*written by another run: env 'python_tool' "
                                             r"\(this run: 'tests/Other-v0'\)"):
        _run(tmp_path, "--updates", "4", "env.id=tests/Other-v0", resume=True)
    assert (tmp_path / "run" / "config.yaml").read_text() == config  # a refused resume changes no file
    with pytest.raises(RunFolderError, match=r"written by another run: env_kwargs \{'dataset': 'tool_expr_train', "
                                             r"[^(]*\} \(this run: \{[^)]*'high': 3\}\)"):
        _run(tmp_path, "--updates", "4", "env.kwargs.high=3", resume=True)


def test_resume_refuses_the_checkpoints_of_another_run_folder(tmp_path, trained):
    assert _run(tmp_path, "--updates", "1", name="other")["updates"] == 1  # same config, another run
    other = tmp_path / "other" / "checkpoints"
    shutil.rmtree(other)
    shutil.copytree(trained, other)
    mine = json.loads((tmp_path / "run" / "run.json").read_text())["run_id"]
    theirs = json.loads((tmp_path / "other" / "run.json").read_text())["run_id"]
    assert mine != theirs
    with pytest.raises(RunFolderError, match=rf"v00000002: written by another run: run_id '{mine}' "
                                             rf"\(this run: '{theirs}'\) \(the run id is in run.json\)"):
        _run(tmp_path, "--updates", "3", resume=True, name="other")


@pytest.mark.parametrize("damage", ["weights", "meta"])
def test_a_truncated_checkpoint_names_the_file_and_how_to_resume_from_the_previous_one(tmp_path, trained, damage):
    f = trained / "v00000002" / ("model.safetensors" if damage == "weights" else "meta.json")
    f.write_bytes(f.read_bytes()[:100])
    said = "model.safetensors is truncated" if damage == "weights" else "meta.json: cannot read it"
    with pytest.raises(CheckpointError, match=rf"v00000002.*{said}.*other checkpoints: \['v00000001'\]\. "
                                              r"To resume from an older checkpoint instead, write its name into "
                                              r".*checkpoints/latest"):
        _run(tmp_path, "--updates", "3", resume=True)
    assert (trained / "latest").read_text() == "v00000002"  # nothing changed
    (trained / "latest").write_text("v00000001")  # what the message says to do
    assert _run(tmp_path, "--updates", "3", resume=True)["updates"] == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2, 3]  # update 2 was redone: its first record was cut


def test_a_missing_checkpoint_folder_is_an_error_not_a_fresh_start(tmp_path, trained):
    shutil.rmtree(trained / "v00000002")
    with pytest.raises(CheckpointError, match=r"checkpoints/latest names 'v00000002', which is not a checkpoint"):
        _run(tmp_path, "--updates", "3", resume=True)
    shutil.rmtree(trained)
    with pytest.raises(RunFolderError, match=r"holds no checkpoint, but .*metrics.jsonl records updates.*--overwrite"):
        _run(tmp_path, "--updates", "3", resume=True)


def test_a_pool_state_of_another_format_is_refused():
    pool = TrajectoryPool()
    state = pool.state_dict()
    assert state["format"] == 1
    TrajectoryPool().load_state_dict({k: v for k, v in state.items() if k != "format"})  # older: format 1
    with pytest.raises(DataError, match="format 2, this agentenv reads format 1"):
        TrajectoryPool().load_state_dict({**state, "format": 2})


@pytest.mark.parametrize("part", ["pool", "run"])
def test_a_run_folder_whose_state_this_code_cannot_read_is_refused_by_name(tmp_path, trained, part):
    def edit(extra):
        if part == "pool":
            extra["pool"]["format"] = 2
        else:
            extra["format"] = 3

    _edit_extra(trained / "v00000002", edit)
    said = {"pool": r"its pool state cannot be read \(bad pool state: format 2, this agentenv reads format 1\)",
            "run": r"run state format 3, this agentenv reads formats 1 to 2"}[part]
    with pytest.raises(RunFolderError, match=rf"checkpoints/v00000002/meta.json: {said}"):
        _run(tmp_path, "--updates", "3", resume=True)


def test_an_older_checkpoint_without_tasks_in_flight_still_resumes(tmp_path, trained, caplog):
    def to_format_1(extra):  # what checkpoints held before the run state had a format
        extra["identity"] = {k: extra["identity"][k] for k in ("model", "env", "objective", "group_size")}
        for key in ("format", "collector", "logs", "resumes"):
            del extra[key]

    _edit_extra(trained / "v00000002", to_format_1)
    with caplog.at_level(logging.WARNING):
        assert _run(tmp_path, "--updates", "3", resume=True)["updates"] == 3
    assert "does not record env_kwargs, run_id (an older checkpoint): not checked" in caplog.text
    assert "older checkpoint (run state format 1): the tasks in flight when it was written were not recorded" \
        in caplog.text


def test_the_checkpoint_holds_the_tasks_in_flight_and_a_resume_requeues_them(tmp_path, trained):
    extra = json.loads((trained / "v00000002" / "meta.json").read_text())["extra"]
    tasks, pooled = extra["collector"], [t["info"]["seed"] for t in extra["pool"]["trajectories"]]
    run = tmp_path / "run"
    consumed = [json.loads(line)["seed"] for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(tasks["in_flight"]) == 4  # run.concurrency: every worker was playing one
    # the seeds handed out are consumed, pooled, in flight or requeued: each in one place
    assert sorted(consumed + pooled + tasks["in_flight"] + tasks["requeued"]) == list(range(tasks["next_seed"]))
    assert extra["logs"]["staleness.jsonl"] == (run / "staleness.jsonl").stat().st_size
    assert _run(tmp_path, "--updates", "4", resume=True)["updates"] == 4
    record = json.loads((run / "resumes.jsonl").read_text())
    assert record["checkpoint"] == "v00000002" and record["requeued_tasks"] == tasks["in_flight"]
    assert record["requeued_total"] == len(tasks["in_flight"])
    consumed = [json.loads(line)["seed"] for line in (run / "staleness.jsonl").read_text().splitlines()]
    assert len(consumed) == len(set(consumed)) == 4 * 4
    extra = json.loads((trained / "v00000004" / "meta.json").read_text())["extra"]
    tasks, pooled = extra["collector"], [t["info"]["seed"] for t in extra["pool"]["trajectories"]]
    assert sorted(consumed + pooled + tasks["in_flight"] + tasks["requeued"]) == list(range(tasks["next_seed"]))


async def test_the_collector_state_round_trips_and_requeues_in_flight_tasks_first():
    out: list = []
    c = RolloutCollector(CountdownEnv, ScriptedEngine(["done"]), CharRenderer(), RolloutConfig(max_turns=3),
                         out.append, concurrency=2, first_seed=10)
    await c.collect(3)
    c.load_state_dict({"next_seed": 20, "in_flight": [14, 15], "requeued": [3]})
    assert c.state_dict() == {"next_seed": 20, "in_flight": [], "requeued": [14, 15, 3]}
    assert [t.info["seed"] for t in await c.collect(4)] == [14, 15, 3, 20]
    assert c.state_dict() == {"next_seed": 21, "in_flight": [], "requeued": []}
    assert c.load_state_dict({"next_seed": 7}) == [] and c.next_seed == 7  # format 1: only the position
    with pytest.raises(DataError, match="bad collector state"):
        c.load_state_dict({"in_flight": [1]})
    assert c.next_seed == 7


@pytest.mark.parametrize(("override", "said"), [
    ("model.name=another-base-model", "model 'embedded SmolLM2-135M-Instruct' (this run: 'another-base-model')"),
    ("learner.lora_rank=4", "lora None (this run: {'rank': 4"),
])
def test_a_resume_of_another_base_model_or_adapters_is_refused_before_the_model_loads(tmp_path, trained, override,
                                                                                       said):
    loads = []

    def load_policy(cfg, **kwargs):
        loads.append(cfg.model.name)
        return scripted_parts([]).load_policy(cfg, **kwargs)

    argv = ["--run-dir", str(tmp_path / "run"), *OVERRIDES, "run.checkpoint_every=1", "--updates", "3", override,
            "--resume"]
    cfg, args = recipe.parse_args(argv)
    run_dir = recipe.prepare_run_dir(cfg, resume=True, overwrite=False)
    cfg = recipe.resumed_config(run_dir, args.overrides)
    parts = replace(scripted_parts([]), env_factory=lambda cfg, *_: SlowCountdownEnv, load_policy=load_policy)
    with pytest.raises(RunFolderError, match=re.escape(f"written by another run: {said}")):
        asyncio.run(asyncio.wait_for(train_loop.train(cfg, run_dir, resume=True, parts=parts), 90))
    assert loads == []  # refused before the policy (and its warm-up) loaded
