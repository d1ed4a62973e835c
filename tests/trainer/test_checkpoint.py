"""Atomic checkpoints: round trip, resume numbering, corruption, disk full."""

from __future__ import annotations

import errno
import os
import random

import numpy as np
import pytest
import torch

from agentenv.errors import CheckpointError
from agentenv.trainer import checkpoint as ckpt
from agentenv.trainer.learners.config import ObjectiveConfig, OptimConfig
from agentenv.trainer.learners.single import Learner

from .conftest import make_trajectories, tiny_model


def _learner(seed=0):
    return Learner(tiny_model(seed), OptimConfig(lr=1e-3, warmup_steps=3), objective=ObjectiveConfig(delta=10.0))


def test_round_trip_resume_continues_versions_and_rng(tmp_path):
    a = _learner(0)
    trajs = make_trajectories(4, seed=1, rewards=[1, 0, 0, 1])
    a.update(trajs)
    a.update(trajs)
    path = a.save(tmp_path, pool_state={"rate": 0.25, "pending": ["t1", "t2"]}, extra={"step": 2})
    assert path.name == "v00000002" and (tmp_path / "latest").read_text() == "v00000002"
    # the RNG draws after saving are what a resumed run draws
    expect = (torch.rand(3), np.random.rand(), random.random())
    a.update(trajs)
    b = _learner(123)
    loaded = b.restore(tmp_path)
    assert loaded.version == 2 == b.version
    assert loaded.pool_state == {"rate": 0.25, "pending": ["t1", "t2"]} and loaded.extra == {"step": 2}
    got = (torch.rand(3), np.random.rand(), random.random())
    assert torch.equal(got[0], expect[0]) and got[1:] == expect[1:]
    # same weights/optimizer/scheduler as `a` had at v2: one more identical update gives identical weights
    a2 = _learner(0)
    a2.restore(path)
    b.update(trajs)
    a2.update(trajs)
    assert b.version == 3
    assert b.scheduler.state_dict()["last_epoch"] == 3
    for (k, v), (_, w) in zip(b.model.state_dict().items(), a.model.state_dict().items(), strict=True):
        torch.testing.assert_close(v, w, rtol=0, atol=0, msg=k)


def test_keep_prunes_and_previous_stays_intact(tmp_path):
    a = _learner(1)
    m = a.model
    p0 = ckpt.save_checkpoint(tmp_path, model=m, optimizer=a.optimizer, scheduler=None, version=0, keep=2)
    p1 = ckpt.save_checkpoint(tmp_path, model=m, optimizer=a.optimizer, scheduler=None, version=1, keep=2)
    p1b = ckpt.save_checkpoint(tmp_path, model=m, optimizer=a.optimizer, scheduler=None, version=1, keep=2)
    assert p1b.name == "v00000001-1" and not p0.exists() and p1.exists()
    assert ckpt.latest_checkpoint(tmp_path) == p1b
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["v00000001", "v00000001-1"]


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete_meta", "garbage_meta"])
def test_corrupt_checkpoint_fails_clearly_and_changes_nothing(tmp_path, damage):
    a = _learner(2)
    good = a.save(tmp_path)
    a.update(make_trajectories(4, seed=2, rewards=[1, 0, 0, 1]))
    bad = a.save(tmp_path)
    if damage == "truncate":
        f = bad / "model.safetensors"
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "flip":
        f = bad / "trainer.pt"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0xFF
        f.write_bytes(bytes(data))
    elif damage == "delete_meta":
        (bad / "meta.json").unlink()
    else:
        (bad / "meta.json").write_text("{not json")
    b = _learner(3)
    before = {k: v.clone() for k, v in b.model.state_dict().items()}
    with pytest.raises(CheckpointError, match="v00000000"):  # names the intact previous one
        b.restore(tmp_path)
    assert b.version == 0
    assert all(torch.equal(before[k], v) for k, v in b.model.state_dict().items())
    assert b.restore(good).version == 0  # the previous checkpoint is intact


def test_disk_full_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    a = _learner(4)
    first = a.save(tmp_path)
    a.update(make_trajectories(4, seed=4, rewards=[1, 0, 0, 1]))
    real_save = torch.save

    def full(obj, f, *args, **kw):
        if str(f).endswith("rng.pt"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, f, *args, **kw)

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match="No space left"):
        a.save(tmp_path)
    monkeypatch.setattr(torch, "save", real_save)
    assert sorted(os.listdir(tmp_path)) == ["latest", first.name]
    assert ckpt.latest_checkpoint(tmp_path) == first
    # failing at the pointer update: the renamed folder is removed again, `latest` still names the old one
    real_replace = os.replace

    def full_replace(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "replace", full_replace)
    with pytest.raises(CheckpointError):
        a.save(tmp_path)
    monkeypatch.setattr(os, "replace", real_replace)
    assert ckpt.latest_checkpoint(tmp_path) == first
    assert sorted(os.listdir(tmp_path)) == ["latest", first.name]
    assert _learner(5).restore(tmp_path).version == 0


def test_unserialisable_pool_state(tmp_path):
    a = _learner(6)
    with pytest.raises(CheckpointError, match="JSON"):
        a.save(tmp_path, pool_state={"x": object()})
    assert not tmp_path.exists() or os.listdir(tmp_path) == []


def test_manager_save_and_load_latest(tmp_path):
    a = _learner(7)
    mgr = ckpt.CheckpointManager(tmp_path / "ck", keep=1)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        mgr.load_latest(a)
    a.update(make_trajectories(4, seed=7, rewards=[1, 0, 0, 1]))
    mgr.save(a, extra={"pool": {"rate": 0.5}, "next_seed": 11})
    a.update(make_trajectories(4, seed=8, rewards=[1, 0, 0, 1]))
    mgr.save(a, extra={"pool": {"rate": 0.25}, "next_seed": 12}, pool_state={"n": 3})
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "ck")] == ["v00000002"]
    b = _learner(8)
    extra = mgr.load_latest(b)
    assert b.version == 2 and extra == {"pool": {"rate": 0.25}, "next_seed": 12, "pool_state": {"n": 3}}
    for k, v in a.model.state_dict().items():
        assert torch.equal(b.model.state_dict()[k], v)
