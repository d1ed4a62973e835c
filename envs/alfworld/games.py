"""ALFWorld game files: splits, task types, validation, and the cached train split.

The data set (``../shared/data/alfworld``, see docs/architecture.md, "Data") holds one self-contained TextWorld game
per ``json_2.1.1/<split>/<task folder>/<trial>/game.tw-pddl`` file (JSON with ``pddl_domain``,
``grammar``, ``pddl_problem``, ``solvable`` and ``walkthrough``). The train split ships as
``train.tar.gz``; it is extracted once into ``agentenv.paths.cache_dir("alfworld")`` and the shared
folder is never written. Task types follow ALFWorld (Shridhar et al., ICLR 2021, Table 1).
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentenv.errors import DataError
from agentenv.paths import cache_dir, data_dir

#: Split names accepted by :func:`list_games` (papers call the first two "seen" and "unseen").
SPLITS = ("valid_seen", "valid_unseen", "train")
_ALIASES = {"seen": "valid_seen", "unseen": "valid_unseen"}

#: ALFWorld's task-folder prefix -> the short task-type name used in reports.
TASK_TYPES: dict[str, str] = {
    "pick_and_place_simple": "pick_and_place",
    "pick_clean_then_place_in_recep": "pick_clean_then_place",
    "pick_heat_then_place_in_recep": "pick_heat_then_place",
    "pick_cool_then_place_in_recep": "pick_cool_then_place",
    "look_at_obj_in_light": "look_at_obj_in_light",
    "pick_two_obj_and_place": "pick_two_obj",
}

#: Keys a usable game file must hold.
REQUIRED_KEYS = ("pddl_domain", "grammar", "pddl_problem", "walkthrough")

GAME_FILE = "game.tw-pddl"


@dataclass(frozen=True)
class GameRef:
    """One game of a split.

    Attributes:
        path: The ``game.tw-pddl`` file.
        name: ``<task folder>/<trial>``, unique within a split.
        task_type: Short task type (a value of :data:`TASK_TYPES`).
    """

    path: Path
    name: str
    task_type: str


def canonical_split(split: str) -> str:
    """Return the canonical split name (``seen`` -> ``valid_seen``).

    Raises:
        DataError: ``split`` is not one of :data:`SPLITS` or an alias.
    """
    name = _ALIASES.get(split, split)
    if name not in SPLITS:
        raise DataError(
            f"unknown ALFWorld split {split!r}; expected one of {', '.join(SPLITS)} (or seen/unseen)"
        )
    return name


def task_type_of(task_folder: str) -> str:
    """Short task type of a task folder such as ``pick_heat_then_place_in_recep-Egg-None-Fridge-5``.

    Raises:
        DataError: The folder name starts with no known task type.
    """
    prefix = task_folder.split("-", 1)[0]
    try:
        return TASK_TYPES[prefix]
    except KeyError:
        raise DataError(f"game folder {task_folder!r} names no ALFWorld task type") from None


def alfworld_root(override: str | os.PathLike[str] | None = None) -> Path:
    """The ``alfworld`` data folder: ``override`` if given, else ``<data_dir>/alfworld``.

    Raises:
        DataError: The folder does not exist.
    """
    root = Path(override) if override else data_dir() / "alfworld"
    if not root.is_dir():
        raise DataError(f"ALFWorld data folder not found: {root}")
    return root


def list_games(split: str, root: str | os.PathLike[str] | None = None) -> list[GameRef]:
    """All games of ``split``, sorted by name (a stable order: index ``i`` is the same game everywhere).

    Args:
        split: ``valid_seen``, ``valid_unseen``, ``train`` (or ``seen`` / ``unseen``).
        root: The ``alfworld`` data folder (default ``<data_dir>/alfworld``).

    Raises:
        DataError: Unknown split, missing folder, no games, or a folder without a task type.
    """
    split = canonical_split(split)
    base = alfworld_root(root)
    split_dir = extract_train(base) if split == "train" else base / "json_2.1.1" / split
    if not split_dir.is_dir():
        raise DataError(f"ALFWorld split folder not found: {split_dir}")
    games = [
        GameRef(
            path=p,
            name=f"{p.parent.parent.name}/{p.parent.name}",
            task_type=task_type_of(p.parent.parent.name),
        )
        for p in split_dir.glob(f"*/*/{GAME_FILE}")
    ]
    if not games:
        raise DataError(f"no {GAME_FILE} files under {split_dir}")
    return sorted(games, key=lambda g: g.name)


def read_game(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check one game file.

    Returns:
        The game's JSON data, ready for ``textworld``'s ``PddlEnv.load``.

    Raises:
        DataError: The file is missing or unreadable, is not JSON, lacks a required key, or has a
            walkthrough that is not a list of commands.
    """
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        raise DataError(f"ALFWorld game file not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"ALFWorld game file {path} is unreadable or not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"ALFWorld game file {path} does not hold a JSON object")
    missing = [k for k in REQUIRED_KEYS if not data.get(k)]
    if missing:
        raise DataError(f"ALFWorld game file {path} lacks {', '.join(missing)}")
    walk = data["walkthrough"]
    if not isinstance(walk, list) or not all(isinstance(c, str) for c in walk):
        raise DataError(f"ALFWorld game file {path}: walkthrough is not a list of commands")
    return data


def extract_train(root: str | os.PathLike[str] | None = None) -> Path:
    """Extract ``train.tar.gz`` once into the cache and return its ``json_2.1.1/train`` folder.

    The archive is unpacked into a temporary folder beside the target and renamed into place, under
    a file lock, so concurrent callers and an interrupted extraction never leave a half-filled
    folder. A marker records the archive's size and mtime: a changed archive is extracted again.

    Raises:
        DataError: The archive is missing or corrupt, or holds no ``json_2.1.1/train`` folder.
    """
    base = alfworld_root(root)
    archive = base / "train.tar.gz"
    if not archive.is_file():
        raise DataError(f"ALFWorld train archive not found: {archive}")
    st = archive.stat()
    stamp = f"{archive.resolve()} {st.st_size} {int(st.st_mtime)}"
    cache = cache_dir("alfworld")
    target = cache / "train"
    marker = target / ".extracted"
    with open(cache / ".train.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and marker.read_text() == stamp:
            return target / "json_2.1.1" / "train"
        tmp = Path(tempfile.mkdtemp(prefix="train.", dir=cache))
        try:
            with tarfile.open(archive, "r:gz") as tar:
                tar.extractall(tmp, filter="data")
            if not (tmp / "json_2.1.1" / "train").is_dir():
                raise DataError(f"{archive} holds no json_2.1.1/train folder")
            (tmp / ".extracted").write_text(stamp)
            shutil.rmtree(target, ignore_errors=True)
            tmp.rename(target)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise DataError(f"cannot extract {archive}: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target / "json_2.1.1" / "train"
