"""register / make / spec / plugins, in the manner of Gymnasium's registry."""

from __future__ import annotations

import importlib.metadata
import logging

import pytest

import agentenv
from agentenv import registration
from agentenv.errors import EnvNotFound, RegistrationError
from tests.tiny_env import RepeatNumberEnv


@pytest.fixture
def clean_ids():
    added: list[str] = []
    yield added
    for i in added:
        agentenv.registry.pop(i, None)


def test_builtins_are_registered_lazily() -> None:
    assert {"python_tool", "alfworld"} <= set(agentenv.registry)
    assert agentenv.spec("python_tool").entry_point == "agentenv.envs.python_tool:PythonToolEnv"
    assert "boxed" in agentenv.spec("python_tool").description


def test_register_make_and_override(clean_ids) -> None:
    clean_ids.append("tests/Repeat-v0")
    agentenv.register("tests/Repeat-v0", "tests.tiny_env:RepeatNumberEnv", high=5, max_tries=3)
    env = agentenv.make("tests/Repeat-v0", max_tries=1)
    assert type(env) is RepeatNumberEnv and (env.high, env.max_tries) == (5, 1)
    clean_ids.append("tests/Callable-v0")
    agentenv.register("tests/Callable-v0", lambda **kw: RepeatNumberEnv(**kw))
    assert agentenv.make("tests/Callable-v0", high=2).high == 2


def test_keyword_arguments_the_env_does_not_take_are_a_config_error(clean_ids) -> None:
    """Another env's recipe kwargs (python_tool's ``dataset``) name the env's own parameters, no TypeError."""
    from agentenv.errors import ConfigError

    clean_ids.append("tests/Repeat-v0")
    agentenv.register("tests/Repeat-v0", "tests.tiny_env:RepeatNumberEnv")
    takes = r"'tests/Repeat-v0' does not take 'dataset', 'max_turns'; it takes: high, max_tries"
    with pytest.raises(ConfigError, match=takes):
        agentenv.make("tests/Repeat-v0", dataset="math_train", max_turns=4)
    # registered defaults are checked too; a factory taking **kwargs is not second-guessed
    clean_ids += ["tests/BadDefault-v0", "tests/Anything-v0"]
    agentenv.register("tests/BadDefault-v0", RepeatNumberEnv, hihg=3)
    with pytest.raises(ConfigError, match="'hihg'"):
        agentenv.make("tests/BadDefault-v0")
    agentenv.register("tests/Anything-v0", lambda **kw: RepeatNumberEnv(high=kw.get("high", 3)))
    assert agentenv.make("tests/Anything-v0", unused=1).high == 3


def test_duplicate_id_raises(clean_ids) -> None:
    clean_ids.append("tests/Dup-v0")
    agentenv.register("tests/Dup-v0", RepeatNumberEnv)
    with pytest.raises(RegistrationError, match="already registered"):
        agentenv.register("tests/Dup-v0", RepeatNumberEnv)


def test_unknown_id_lists_known() -> None:
    with pytest.raises(EnvNotFound, match="python_tool") as exc:
        agentenv.make("nope/Nothing-v0")
    assert isinstance(exc.value, KeyError) and "nope/Nothing-v0" in str(exc.value)


def test_an_id_the_registry_lacks_goes_to_the_resolvers_in_order(monkeypatch, clean_ids) -> None:
    clean_ids.append("mine/Seven-v0")
    asked: list[str] = []

    def resolve(env_id: str) -> registration.EnvSpec | None:
        asked.append(env_id)
        if env_id != "mine/Seven-v0":
            return None
        return agentenv.register(env_id, RepeatNumberEnv)

    monkeypatch.setattr(registration, "_resolvers", dict(registration._resolvers))  # noqa: SLF001 (restored after)
    registration.add_resolver("mine", registration.Resolver(resolve, "mine's ids: mine/NAME"))
    assert agentenv.spec("mine/Seven-v0").entry_point is RepeatNumberEnv and asked == ["mine/Seven-v0"]
    assert agentenv.spec("mine/Seven-v0") and asked == ["mine/Seven-v0"]  # registered now: not asked again
    with pytest.raises(EnvNotFound, match=r"peers' ids: gym/ID.*; mine's ids: mine/NAME"):
        agentenv.spec("other/Nothing-v0")  # every resolver is asked, each one's ids named
    assert asked[-1] == "other/Nothing-v0"


def test_the_registry_imports_no_adapter():
    # the peers' ids reach the registry through the plugin entry point, so there is no import circle
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(registration))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "agentenv.core" in imported  # the walk sees the module's imports
    assert not [m for m in imported if m and m.startswith("agentenv.adapters")]


def test_bad_entry_points(clean_ids) -> None:
    clean_ids += ["tests/NoColon-v0", "tests/Missing-v0", "tests/NotEnv-v0"]
    agentenv.register("tests/NoColon-v0", "tests.tiny_env.RepeatNumberEnv")
    agentenv.register("tests/Missing-v0", "tests.tiny_env:Nothing")
    agentenv.register("tests/NotEnv-v0", dict)
    with pytest.raises(RegistrationError, match="module:attr"):
        agentenv.make("tests/NoColon-v0")
    with pytest.raises(RegistrationError, match="cannot load"):
        agentenv.make("tests/Missing-v0")
    with pytest.raises(RegistrationError, match="not an agentenv Env"):
        agentenv.make("tests/NotEnv-v0")


def test_broken_plugin_is_logged_and_others_load(monkeypatch, caplog, clean_ids) -> None:
    clean_ids.append("tests/FromPlugin-v0")

    def good() -> None:
        agentenv.register("tests/FromPlugin-v0", RepeatNumberEnv)

    class EP:
        def __init__(self, name, fn):
            self.name, self._fn = name, fn

        def load(self):
            return self._fn

    def broken() -> None:
        raise ImportError("missing dependency")

    installed = list(importlib.metadata.entry_points(group="agentenv.envs"))  # agentenv's own "peers" among them
    assert "peers" in [ep.name for ep in installed]
    eps = [*installed, EP("broken", broken), EP("good", good)]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group: eps if group == "agentenv.envs" else []
    )
    with caplog.at_level(logging.WARNING, logger="agentenv.registration"):
        loaded = registration.load_plugins(force=True)
    assert loaded == [ep.name for ep in installed] + ["good"]
    assert "broken" in caplog.text and "missing dependency" in caplog.text
    assert isinstance(agentenv.make("tests/FromPlugin-v0"), RepeatNumberEnv)
    assert registration.load_plugins() == []  # once only, unless forced
