"""Game listing, task types, game-file validation and the cached train split (no game engine needed)."""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from agentenv.envs.alfworld.games import (
    TASK_TYPES,
    canonical_split,
    extract_train,
    list_games,
    read_game,
    task_type_of,
)
from agentenv.errors import DataError


def test_valid_splits_have_the_paper_counts(data_dir: Path) -> None:
    seen = list_games("valid_seen")
    unseen = list_games("unseen")
    assert (len(seen), len(unseen)) == (140, 134)
    assert [g.name for g in seen] == sorted(g.name for g in seen)
    assert set(Counter(g.task_type for g in seen)) == set(TASK_TYPES.values())
    assert set(Counter(g.task_type for g in unseen)) == set(TASK_TYPES.values())
    assert all(g.path.name == "game.tw-pddl" and g.path.is_file() for g in seen + unseen)


def test_task_type_of() -> None:
    assert task_type_of("pick_heat_then_place_in_recep-Egg-None-Fridge-5") == "pick_heat_then_place"
    assert task_type_of("look_at_obj_in_light-Bowl-None-DeskLamp-301") == "look_at_obj_in_light"
    with pytest.raises(DataError, match="task type"):
        task_type_of("dance-Floor-1")


def test_unknown_split_is_a_data_error() -> None:
    with pytest.raises(DataError, match="unknown ALFWorld split 'test'"):
        canonical_split("test")
    with pytest.raises(DataError):
        list_games("valid_train")


def test_read_game_checks_the_file(tmp_path: Path, data_dir: Path) -> None:
    real = list_games("valid_seen")[0].path
    data = read_game(real)
    assert isinstance(data["walkthrough"], list) and data["walkthrough"]
    with pytest.raises(DataError, match="not found"):
        read_game(tmp_path / "nope.tw-pddl")
    bad = tmp_path / "corrupt.tw-pddl"
    bad.write_text(real.read_text()[:500])
    with pytest.raises(DataError, match="not JSON"):
        read_game(bad)
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError):
        read_game(bad)
    bad.write_text(json.dumps({k: v for k, v in data.items() if k != "grammar"}))
    with pytest.raises(DataError, match="lacks grammar"):
        read_game(bad)
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(DataError, match="JSON object"):
        read_game(bad)


def _make_root(tmp_path: Path, data_dir: Path, members: dict[str, bytes]) -> Path:
    root = tmp_path / "alfworld"
    root.mkdir()
    with tarfile.open(root / "train.tar.gz", "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return root


def test_train_is_extracted_once_into_the_cache(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path / "cache"))
    seen = list_games("valid_seen")
    payload = {f"json_2.1.1/train/{g.name}/game.tw-pddl": g.path.read_bytes() for g in (seen[0], seen[-1])}
    root = _make_root(tmp_path, data_dir, payload)
    games = list_games("train", root)
    assert [g.name for g in games] == sorted([seen[0].name, seen[-1].name])
    assert all(str(g.path).startswith(str(tmp_path / "cache" / "alfworld")) for g in games)
    marker = tmp_path / "cache" / "alfworld" / "train" / ".extracted"
    first = marker.stat().st_mtime_ns
    assert extract_train(root) == games[0].path.parents[2]
    assert marker.stat().st_mtime_ns == first  # not extracted again
    assert not list((tmp_path / "alfworld").glob("json_2.1.1"))  # the data folder is untouched


def test_corrupt_or_empty_train_archive_is_a_data_error(tmp_path: Path, data_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path / "cache"))
    root = _make_root(tmp_path, data_dir, {"other/readme.txt": b"hi"})
    with pytest.raises(DataError, match="no json_2.1.1/train"):
        list_games("train", root)
    (root / "train.tar.gz").write_bytes(b"\x1f\x8b" + b"\x00" * 64)
    with pytest.raises(DataError, match="cannot extract"):
        extract_train(root)
    assert not list((tmp_path / "cache" / "alfworld").glob("train*/"))  # nothing half-extracted


@pytest.mark.slow
def test_real_train_split_has_3553_games(data_dir: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("AGENTENV_CACHE", str(tmp_path / "cache"))
    games = list_games("train")
    assert len(games) == 3553
    assert set(g.task_type for g in games) == set(TASK_TYPES.values())
