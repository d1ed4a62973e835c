"""Checkpoint pieces the DeepSpeed learners use: extra state files written into the checkpoint
(checksummed, published atomically), weights given as a state dict, and a clear error, with nothing
changed, when a checkpoint of one learner backend is resumed by another (fast: no DeepSpeed)."""

from __future__ import annotations

import json

import pytest
import torch

from agentenv.errors import CheckpointError
from agentenv.trainer import checkpoint as ckpt
from agentenv.trainer.learners.config import OptimConfig
from agentenv.trainer.learners.single import Learner

from .conftest import tiny_model


def _write_state(folder):
    (folder / "deepspeed" / "state").mkdir(parents=True)
    (folder / "deepspeed" / "state" / "optim_states.pt").write_bytes(b"shard-0" * 100)


def test_extra_state_files_are_checksummed_and_handed_back(tmp_path):
    model = tiny_model(1)
    path = ckpt.save_checkpoint(tmp_path, model=model.state_dict(), optimizer=None, scheduler=None, version=3,
                                extra={"next_seed": 9}, write_state=_write_state)
    meta = json.loads((path / "meta.json").read_text())
    assert meta["files"]["deepspeed/state/optim_states.pt"]["size"] == 700
    seen = []
    other = tiny_model(2)
    loaded = ckpt.load_checkpoint(tmp_path, model=other, read_state=lambda p: seen.append(p))
    assert seen == [path] and loaded.version == 3 and loaded.extra == {"next_seed": 9}
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())
    # a corrupted extra file is refused before anything is applied
    (path / "deepspeed" / "state" / "optim_states.pt").write_bytes(b"shard-X" * 100)
    seen.clear()
    with pytest.raises(CheckpointError, match="optim_states.pt is corrupt"):
        ckpt.load_checkpoint(tmp_path, model=None, read_state=lambda p: seen.append(p))
    assert seen == []


def test_a_deepspeed_checkpoint_resumed_by_the_single_learner_is_refused_unchanged(tmp_path):
    ckpt.save_checkpoint(tmp_path, model=tiny_model(1), optimizer=None, scheduler=None, version=5,
                         write_state=_write_state)
    learner = Learner(tiny_model(2), OptimConfig())
    before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="no optimizer state .*openrlhf/ray learner"):
        ckpt.CheckpointManager(tmp_path).load_latest(learner)
    assert learner.version == 0
    assert all(torch.equal(learner.model.state_dict()[k], v) for k, v in before.items())
