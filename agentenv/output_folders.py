"""Folders agentenv commands write: which ones ``--overwrite`` may delete, and the check before each write.

A command that writes a folder (``train --run-dir``, ``eval --out``, ``export --out``) claims it with
:func:`claim_folder`; one that writes a folder of such folders (``compare --out``) checks it with
:func:`claim_parent` and claims each folder inside. A missing or empty folder is created; a folder that holds files
is replaced (``overwrite``) or continued (``resume``) only when it is one this kind of command wrote,
recognised by its *sign*: a JSON file the command writes, holding an object with a known key (a
training run: ``run.json`` with ``run_id``; an evaluation: ``report.json`` with ``protocol`` or
``overall``). Anything else (a folder of the user's files, the checkout, the home folder, a folder
that holds the current directory) is refused with a :class:`~agentenv.errors.RunFolderError` and
nothing in it is touched.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from agentenv.errors import RunFolderError


@dataclass(frozen=True)
class FolderKind:
    """What a command writes into its folder, and how such a folder is recognised.

    Attributes:
        name: What the folder holds, for messages (``"training run"``).
        sign: The file that marks the folder as one of this kind (relative to the folder).
        keys: The sign is a JSON object holding at least one of these keys.
        flag: The command-line flag that names the folder, for messages (``"--run-dir"``).
    """

    name: str
    sign: str
    keys: tuple[str, ...]
    flag: str

    def holds(self, folder: Path) -> bool:
        """Whether ``folder`` carries this kind's sign (an unreadable or foreign sign file does not count)."""
        try:
            data = json.loads((folder / self.sign).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(data, dict) and any(k in data for k in self.keys)


RUN = FolderKind("training run", "run.json", ("run_id",), "--run-dir")
"""A folder of ``agentenv train`` (its ``run.json`` holds the run id)."""
EVALUATION = FolderKind("evaluation", "report.json", ("protocol", "overall"), "--out")
"""A folder of ``agentenv eval`` (its ``report.json``)."""
EXPORT = FolderKind("exported model", "agentenv_export.json", ("run", "version"), "--out")
"""A folder of ``agentenv export`` (its ``agentenv_export.json``)."""


def folder_name(*parts: str) -> str:
    """A folder name of ids and labels: the non-empty ``parts`` joined by ``_``, other than ``[A-Za-z0-9._-]`` as ``_``.

    >>> folder_name("reasoning_gym_tool/gcd")
    'reasoning_gym_tool_gcd'
    >>> folder_name("alfworld", "valid_unseen")
    'alfworld_valid_unseen'
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", "_".join(p for p in parts if p)).strip("_.")


def _protected(folder: Path) -> str | None:
    """Why ``folder`` may never be deleted whatever it holds, or None."""
    here = Path.cwd().resolve()
    real = folder.resolve()
    if real == Path(real.anchor) or real == Path.home().resolve():
        return "it is the home folder or the filesystem root"
    if real == here or real in here.parents:
        return "it holds the current directory"
    if (real / ".git").exists():
        return "it is a git checkout"
    return None


def claim_folder(folder: str | Path, kind: FolderKind, *, overwrite: bool = False, resume: bool = False) -> Path:
    """Make ``folder`` ready for a command of ``kind`` to write; return it (created when missing).

    Args:
        folder: The folder the command writes.
        kind: What the command writes there.
        overwrite: Delete the folder first when it is a folder of ``kind`` (never otherwise).
        resume: Keep a folder of ``kind`` as it is, for the command to continue.

    Raises:
        RunFolderError: ``folder`` is a file; it holds files and is not a folder of ``kind``
            (whatever ``overwrite`` says: nothing is deleted); it is a folder of ``kind`` and neither
            ``overwrite`` nor ``resume`` was given; or ``overwrite`` was given for a folder that may
            never be deleted (the home folder, one holding the current directory, a git checkout).
    """
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{kind.flag} {path} is a file, not a folder")
    if not path.exists() or not any(path.iterdir()):
        path.mkdir(parents=True, exist_ok=True)
        return path
    if not kind.holds(path):
        raise RunFolderError(f"{kind.flag} {path} holds files but is not an agentenv {kind.name} folder (no "
                             f"{kind.sign}); nothing was deleted: choose a new or empty folder")
    if resume:
        return path
    if not overwrite:
        raise RunFolderError(f"{kind.flag} {path} holds an agentenv {kind.name}; pass --overwrite to replace it"
                             + (" or --resume to continue it" if kind in (RUN, EVALUATION) else ""))
    why = _protected(path)
    if why is not None:
        raise RunFolderError(f"{kind.flag} {path}: not deleted, {why}; choose another folder")
    shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def claim_parent(folder: str | Path, names: set[str], what: str, *, flag: str = "--out") -> Path:
    """Make ``folder`` ready for a command that writes only ``names`` into it; return it (created when missing).

    Each entry it writes (a run folder) is claimed on its own with :func:`claim_folder`; this check
    refuses a folder that holds anything else, so that nothing the command writes lands among the
    user's files.

    Raises:
        RunFolderError: ``folder`` is a file, or holds an entry not in ``names`` (listed in the message).
    """
    path = Path(folder)
    if path.exists() and not path.is_dir():
        raise RunFolderError(f"{flag} {path} is a file, not a folder")
    foreign = sorted(p.name for p in path.iterdir() if p.name not in names) if path.is_dir() else []
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise RunFolderError(f"{flag} {path} holds files that are not {what}'s ({shown}); nothing was written or "
                             "deleted: choose a new or empty folder")
    path.mkdir(parents=True, exist_ok=True)
    return path
