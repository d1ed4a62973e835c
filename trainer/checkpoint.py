"""Atomic training checkpoints: model, optimizer, scheduler, policy version, pool state, RNG states.

Layout under a checkpoint root::

    root/
      latest                  # text: name of the newest complete checkpoint (replaced atomically)
      v00000012/              # one complete checkpoint (never modified after it is published)
        model.safetensors     # model weights
        trainer.pt            # optimizer + scheduler state dicts
        rng.pt                # torch (CPU and CUDA), numpy and python RNG states
        meta.json             # version, pool state, extra, and size + sha256 of every file above
        deepspeed/...         # only for the OpenRLHF/DeepSpeed learners: DeepSpeed's own (sharded)
                              # module, optimizer and scheduler states, written by ``write_state``

A save writes everything into a fresh temporary folder in ``root`` (same file system), fsyncs each
file and the folder, renames the folder to its final name, fsyncs ``root``, then replaces ``latest``
through a temporary file and ``os.replace``. A crash or an ``OSError`` (ENOSPC, ...) at any point
leaves the previous checkpoints and ``latest`` as they were. An ``OSError`` leaves no partial
checkpoint folder; a process killed mid-save (``kill -9``) can leave a ``.tmp-*`` folder, or a renamed
folder that ``latest`` does not name yet: neither is ever read, and :func:`discard_unpublished`
removes them (``agentenv train --resume`` does).
A load verifies sizes and checksums and reads everything into memory *before* touching the model or
optimizer, so a truncated or corrupt checkpoint raises :class:`CheckpointError` and changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentenv.errors import CheckpointError
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trainer.pause import pause_point

__all__ = [
    "CheckpointManager",
    "LoadedCheckpoint",
    "discard_unpublished",
    "latest_checkpoint",
    "list_checkpoints",
    "load_checkpoint",
    "read_meta",
    "save_checkpoint",
]

FORMAT = 1
_NAME = re.compile(r"^v(\d{8})(?:-(\d+))?$")


@dataclass(frozen=True)
class LoadedCheckpoint:
    """What :func:`load_checkpoint` restored besides the objects passed in.

    Attributes:
        path: The checkpoint folder.
        version: Policy version (optimizer steps) at save time; continue numbering from it.
        pool_state: The caller's pool state dict, as saved.
        extra: The caller's extra JSON dict (e.g. step counters, config).
    """

    path: Path
    version: int
    pool_state: dict[str, Any]
    extra: dict[str, Any]


# -- saving ----------------------------------------------------------------------------------------
def save_checkpoint(
    root: Path | str,
    *,
    model: torch.nn.Module | Mapping[str, torch.Tensor],
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any | None,
    version: int,
    pool_state: Mapping[str, Any] | None = None,
    extra: Mapping[str, Any] | None = None,
    keep: int = 2,
    write_state: Callable[[Path], None] | None = None,
) -> Path:
    """Write a complete checkpoint atomically and point ``root/latest`` at it.

    Args:
        root: Checkpoint root folder (created if missing).
        model: Model whose ``state_dict()`` is saved (safetensors; tied tensors are stored once each),
            or the full state dict itself (a learner whose weights live elsewhere, e.g. Ray actors).
        optimizer: Saved with ``state_dict()``; None to skip.
        scheduler: Saved with ``state_dict()``; None to skip.
        version: Policy version (optimizer steps).
        pool_state: JSON-serialisable pool state from the caller.
        extra: JSON-serialisable extra data.
        keep: Complete checkpoints to keep (oldest pruned after ``latest`` moved); 0 keeps all.
        write_state: Called with the unpublished checkpoint folder to write further files into it
            (DeepSpeed's ``save_checkpoint``); every file under the folder is checksummed in
            ``meta.json`` and published atomically with the rest.

    Returns:
        The new checkpoint folder.

    Raises:
        CheckpointError: the write failed (disk full, permissions, unserialisable pool state); no
            partial checkpoint is left and ``latest`` is unchanged.
    """
    from safetensors.torch import save_file

    root = Path(root)
    tmp: Path | None = None
    published: Path | None = None  # renamed into place but not yet named by `latest`
    try:
        meta_body = json.dumps(
            {"pool_state": dict(pool_state or {}), "extra": dict(extra or {})}, allow_nan=True
        )
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"pool_state/extra are not JSON-serialisable: {e}") from e
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        src = model if isinstance(model, Mapping) else model.state_dict()
        sd = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in src.items()}
        save_file(sd, str(tmp / "model.safetensors"), metadata={"version": str(version)})
        trainer_state = {
            "optimizer": optimizer.state_dict() if optimizer is not None else None,
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
        }
        torch.save(trainer_state, tmp / "trainer.pt")
        torch.save(_rng_state(), tmp / "rng.pt")
        if write_state is not None:
            write_state(tmp)
        pause_point("checkpoint")  # tests: kill mid-write (agentenv.trainer.pause)
        files = {}
        for f in sorted(q for q in tmp.rglob("*") if q.is_file()):
            name = f.relative_to(tmp).as_posix()
            _fsync(f)
            files[name] = {"size": f.stat().st_size, "sha256": _sha256(f)}
        body = json.loads(meta_body)
        meta = {"format": FORMAT, "version": int(version), "files": files, **body}
        _write_durable(tmp / "meta.json", json.dumps(meta, indent=1).encode())
        _fsync(tmp)
        final = _free_name(root, version)
        os.rename(tmp, final)
        tmp, published = None, final
        _fsync(root)
        _write_durable(root / ".latest.tmp", final.name.encode())
        os.replace(root / ".latest.tmp", root / "latest")
        published = None
        _fsync(root)
        pause_point("saved")  # tests: kill right after a checkpoint
    except OSError as e:
        for leftover in (tmp, published):
            if leftover is not None:
                shutil.rmtree(leftover, ignore_errors=True)
        try:
            (root / ".latest.tmp").unlink(missing_ok=True)
        except OSError:
            pass
        raise CheckpointError(f"could not write checkpoint v{version} under {root}: {e}") from e
    if keep > 0:
        for old in list_checkpoints(root)[:-keep]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)
    return final


# -- loading ---------------------------------------------------------------------------------------
def list_checkpoints(root: Path | str) -> list[Path]:
    """Published checkpoint folders under ``root``, oldest first (by version, then save order)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), int(m.group(2) or 0), p))
    return [p for _, _, p in sorted(found)]


def latest_checkpoint(root: Path | str) -> Path | None:
    """The folder ``root/latest`` names, or None when there is no checkpoint yet.

    Raises:
        CheckpointError: ``latest`` names a folder that does not exist.
    """
    root = Path(root)
    ptr = root / "latest"
    if not ptr.exists():
        return None
    name = ptr.read_text().strip()
    path = root / name
    if not _NAME.match(name) or not path.is_dir():
        raise CheckpointError(f"{ptr} names {name!r}, which is not a checkpoint folder")
    return path


def read_meta(path: Path | str) -> dict[str, Any]:
    """The ``meta.json`` of a checkpoint folder: format, version, file sizes and checksums, pool state, extra.

    Cheap (no weights are read), so a caller can check what a checkpoint belongs to before loading it.

    Raises:
        CheckpointError: ``meta.json`` is missing, truncated or not JSON, or of an unknown format; the
            message names the file.
    """
    f = Path(path) / "meta.json"
    try:
        meta = json.loads(f.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{f}: cannot read it ({e})") from e
    if not isinstance(meta, dict) or not {"version", "files", "pool_state", "extra"} <= meta.keys():
        raise CheckpointError(f"{f}: not a checkpoint's meta.json (missing keys)")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{f}: unknown checkpoint format {meta.get('format')!r}, this agentenv "
                              f"reads format {FORMAT}")
    return meta


def discard_unpublished(root: Path | str) -> list[str]:
    """Remove what a save killed mid-way left under ``root``; return the names removed.

    That is the temporary folders (``.tmp-*``) and pointer (``.latest.tmp``) of unfinished saves, and
    checkpoint folders newer than the one ``latest`` names, or all of them when there is no ``latest``
    (renamed into place, but the save died before ``latest`` moved). Nothing ``latest`` names, nor
    anything older, is touched. Call it only while no save runs (e.g. before resuming).

    Raises:
        CheckpointError: ``latest`` names a folder that does not exist (:func:`latest_checkpoint`).
    """
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for p in sorted(root.iterdir()):
        if p.name.startswith(".tmp-") or p.name == ".latest.tmp":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
            removed.append(p.name)
    latest = latest_checkpoint(root)
    published = list_checkpoints(root)
    for p in published[published.index(latest) + 1 if latest is not None else 0 :]:
        shutil.rmtree(p)
        removed.append(p.name)
    return removed


def load_checkpoint(
    path: Path | str,
    *,
    model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
    map_location: str | torch.device = "cpu",
    read_state: Callable[[Path], None] | None = None,
) -> LoadedCheckpoint:
    """Verify and restore a checkpoint folder, or the newest one when ``path`` is a root.

    Nothing is modified until every file has been verified and read.

    Args:
        path: A checkpoint folder, or a root holding ``latest``.
        model: Restored in place (keys and shapes checked first); None leaves the weights to
            ``read_state``.
        optimizer: Restored in place when given (the checkpoint must hold its state).
        scheduler: Restored in place when given.
        restore_rng: Also restore torch/numpy/python RNG states.
        map_location: Where optimizer tensors are loaded before ``load_state_dict`` moves them.
        read_state: Called with the verified checkpoint folder after the model and optimizer are
            restored, to restore the files ``save_checkpoint(write_state=...)`` added (DeepSpeed's
            ``load_checkpoint``).

    Returns:
        :class:`LoadedCheckpoint` with the version, pool state and extra.

    Raises:
        CheckpointError: missing, truncated or corrupt files, checksum mismatch, a model whose keys
            or shapes differ, or an unknown format. The message lists the other checkpoints present.
    """
    from safetensors.torch import load_file

    path = Path(path)
    if (path / "latest").exists():
        found = latest_checkpoint(path)
        assert found is not None
        path = found
    try:
        meta = read_meta(path)
        for name, info in meta["files"].items():
            f = path / name
            if not f.is_file():
                raise CheckpointError(f"{path}: missing {name}")
            if f.stat().st_size != info["size"]:
                raise CheckpointError(
                    f"{path}: {name} is truncated ({f.stat().st_size} of {info['size']} bytes)"
                )
            if _sha256(f) != info["sha256"]:
                raise CheckpointError(f"{path}: {name} is corrupt (checksum mismatch)")
        weights = load_file(str(path / "model.safetensors"))
        trainer_state = torch.load(path / "trainer.pt", map_location=map_location, weights_only=True)
        rng = torch.load(path / "rng.pt", weights_only=True)
        own = model.state_dict() if model is not None else weights
        if set(own) != set(weights):
            diff = sorted(set(own) ^ set(weights))[:5]
            raise CheckpointError(f"{path}: model keys differ from the checkpoint's (e.g. {diff})")
        for k, v in own.items():
            if v.shape != weights[k].shape:
                raise CheckpointError(
                    f"{path}: {k} has shape {tuple(weights[k].shape)}, the model {tuple(v.shape)}"
                )
    except CheckpointError as e:
        raise CheckpointError(f"{e}; other checkpoints: {_others(path)}") from e
    except (OSError, ValueError, KeyError, RuntimeError, json.JSONDecodeError, EOFError) as e:
        raise CheckpointError(
            f"{path}: cannot read checkpoint ({e}); other checkpoints: {_others(path)}"
        ) from e
    if optimizer is not None and trainer_state["optimizer"] is None:
        ds = (path / "deepspeed").is_dir()
        hint = " (DeepSpeed state: written by the openrlhf/ray learner)" if ds else ""
        raise CheckpointError(f"{path}: holds no optimizer state{hint}")
    # Everything verified: apply.
    if model is not None:
        model.load_state_dict(weights)
    if optimizer is not None:
        optimizer.load_state_dict(trainer_state["optimizer"])
    if scheduler is not None and trainer_state["scheduler"] is not None:
        scheduler.load_state_dict(trainer_state["scheduler"])
    if read_state is not None:
        read_state(path)
    if restore_rng:
        _set_rng_state(rng)
    return LoadedCheckpoint(
        path=path, version=int(meta["version"]), pool_state=meta["pool_state"], extra=meta["extra"]
    )


class CheckpointManager:
    """Checkpoints of a learner under one root folder.

    The learner writes and restores itself: ``learner.save(root, pool_state=, extra=, keep=)`` and
    ``learner.restore(root)`` (:class:`agentenv.trainer.learners.single.Learner`, and the OpenRLHF/DeepSpeed
    learners of :mod:`agentenv.trainer.learners.openrlhf`, which add DeepSpeed's own state files).

    Args:
        root: Checkpoint root (e.g. ``run_dir / "checkpoints"``).
        keep: Complete checkpoints kept (0 keeps all).
    """

    def __init__(self, root: Path | str, *, keep: int = 2) -> None:
        self.root = Path(root)
        self.keep = keep

    def save(self, learner: PolicyLearner, *, pool_state: Mapping[str, Any] | None = None,
             extra: Mapping[str, Any] | None = None) -> Path:
        """Save the learner's model, optimizer, scheduler and version atomically (:func:`save_checkpoint`).

        Raises:
            CheckpointError: the write failed; the previous checkpoint stays the latest.
        """
        return learner.save(self.root, pool_state=pool_state, extra=extra, keep=self.keep)

    def load_latest(self, learner: PolicyLearner) -> dict[str, Any]:
        """Restore the newest checkpoint into ``learner`` (its ``version`` included).

        Returns:
            The checkpoint's ``extra`` dict, with its ``pool_state`` under ``"pool_state"`` when one was
            saved through ``pool_state=`` (and not already a key of ``extra``).

        Raises:
            CheckpointError: no checkpoint under the root, or the latest one is corrupt (nothing
                restored then).
        """
        if latest_checkpoint(self.root) is None:
            raise CheckpointError(f"no checkpoint to resume from under {self.root}")
        loaded = learner.restore(self.root)  # sets learner.version
        extra = dict(loaded.extra)
        if loaded.pool_state:
            extra.setdefault("pool_state", loaded.pool_state)
        return extra


# -- helpers ---------------------------------------------------------------------------------------
def _others(path: Path) -> list[str]:
    return [p.name for p in list_checkpoints(path.parent) if p != path]


def _free_name(root: Path, version: int) -> Path:
    base = root / f"v{version:08d}"
    if not base.exists():
        return base
    n = 1
    while (root / f"{base.name}-{n}").exists():
        n += 1
    return root / f"{base.name}-{n}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: Path) -> None:
    """Fsync a file or a folder (a folder's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rng_state() -> dict[str, Any]:
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def _set_rng_state(s: dict[str, Any]) -> None:
    torch.set_rng_state(s["torch"])
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])
    name, keys, pos, has_gauss, cached = s["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    ver, internal, gauss = s["python"]
    random.setstate((ver, tuple(internal), gauss))
