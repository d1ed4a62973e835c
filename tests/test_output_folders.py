"""Which folders a command may write into or replace: a decoy folder of user files is never deleted."""

from __future__ import annotations

import json
import os

import pytest

from agentenv.errors import RunFolderError
from agentenv.output_folders import EVALUATION, RUN, claim_folder


def decoy(folder):
    """A folder of the user's own files (a thesis), nested one level."""
    (folder / "chapters").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\documentclass{article}")
    (folder / "chapters" / "one.tex").write_text("intro")
    (folder / "config.yaml").write_text("env: {}\n")  # a common file name is no sign of a run
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize("kind", [RUN, EVALUATION])
def test_a_folder_of_user_files_is_refused_and_kept_even_with_overwrite(tmp_path, kind):
    files = decoy(tmp_path / "mine")
    for overwrite, resume in ((False, False), (True, False), (False, True)):
        with pytest.raises(RunFolderError, match=f"not an agentenv {kind.name} folder .*nothing was deleted"):
            claim_folder(tmp_path / "mine", kind, overwrite=overwrite, resume=resume)
    assert sorted(p.relative_to(tmp_path / "mine").as_posix() for p in (tmp_path / "mine").rglob("*")) == files
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "\\documentclass{article}"


def test_a_run_folder_is_replaced_only_with_overwrite(tmp_path):
    run = claim_folder(tmp_path / "run", RUN)  # missing: created
    assert run.is_dir() and not any(run.iterdir())
    assert claim_folder(run, RUN) == run  # empty: free to use
    (run / "run.json").write_text(json.dumps({"run_id": "0123456789ab"}))
    (run / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RunFolderError, match="holds an agentenv training run; pass --overwrite"):
        claim_folder(run, RUN)
    assert claim_folder(run, RUN, resume=True) == run and (run / "metrics.jsonl").exists()
    claim_folder(run, RUN, overwrite=True)
    assert run.is_dir() and not any(run.iterdir())


def test_a_sign_of_another_kind_or_without_its_key_is_no_sign(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "report.json").write_text(json.dumps({"overall": {}}))  # an evaluation, not a run
    with pytest.raises(RunFolderError, match="not an agentenv training run"):
        claim_folder(tmp_path / "a", RUN, overwrite=True)
    (tmp_path / "a" / "run.json").write_text(json.dumps({"name": "my run"}))  # the user's run.json
    with pytest.raises(RunFolderError, match="not an agentenv training run"):
        claim_folder(tmp_path / "a", RUN, overwrite=True)
    assert claim_folder(tmp_path / "a", EVALUATION, overwrite=True) == tmp_path / "a"


def test_the_current_directory_and_a_checkout_are_never_deleted(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"run_id": "0123456789ab"}))
    monkeypatch.chdir(run)
    with pytest.raises(RunFolderError, match="holds the current directory"):
        claim_folder(".", RUN, overwrite=True)
    monkeypatch.chdir(tmp_path)
    (run / ".git").mkdir()
    with pytest.raises(RunFolderError, match="git checkout"):
        claim_folder(run, RUN, overwrite=True)
    assert (run / "run.json").exists() and os.path.isdir(run / ".git")


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(RunFolderError, match="is a file"):
        claim_folder(tmp_path / "f", RUN, overwrite=True)
    assert (tmp_path / "f").read_text() == "x"
