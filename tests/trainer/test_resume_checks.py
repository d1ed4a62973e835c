"""--resume refuses what it cannot continue: a checkpoint of another run, a pool state of another format."""

from __future__ import annotations

import asyncio

import pytest

from agentenv.errors import DataError, RunFolderError
from agentenv.pool import TrajectoryPool
from agentenv.trainer import recipe, setup
from tests.fakes import CountdownEnv

from .test_loop_failures import OVERRIDES, scripted  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path, *extra, resume=False):
    argv = ["--run-dir", str(tmp_path / "run"), *OVERRIDES, "run.checkpoint_every=1", *extra]
    cfg, args = recipe.parse_args(argv + (["--resume"] if resume else []))
    run_dir = recipe.prepare_run_dir(cfg, resume=resume, overwrite=False)
    if resume:
        cfg = recipe.resumed_config(run_dir, args.overrides)
    return asyncio.run(asyncio.wait_for(recipe.train(cfg, run_dir, resume=resume), 90))


def test_resume_refuses_a_checkpoint_written_for_another_environment(tmp_path, monkeypatch, scripted):  # noqa: F811
    monkeypatch.setattr(setup, "env_factory", lambda cfg: CountdownEnv)
    assert _run(tmp_path, "--updates", "2")["updates"] == 2
    assert _run(tmp_path, "--updates", "3", resume=True)["updates"] == 3  # the same run continues
    with pytest.raises(RunFolderError, match=r"checkpoints/.*written by another run: env 'python_tool' "
                                             r"\(this run: 'tests/Other-v0'\)"):
        _run(tmp_path, "--updates", "4", "env.id=tests/Other-v0", resume=True)


def test_a_pool_state_of_another_format_is_refused():
    pool = TrajectoryPool()
    state = pool.state_dict()
    assert state["format"] == 1
    TrajectoryPool().load_state_dict({k: v for k, v in state.items() if k != "format"})  # older: format 1
    with pytest.raises(DataError, match="format 2, this agentenv reads format 1"):
        TrajectoryPool().load_state_dict({**state, "format": 2})
