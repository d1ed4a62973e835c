"""Without the optional ALFWorld install the environment fails at construction, saying how to install it."""

from __future__ import annotations

import importlib.util

import pytest

from agentenv.errors import ConfigError


def test_missing_textworld_is_a_clear_error_at_construction(monkeypatch):
    from agentenv.envs.alfworld import env as alf_env

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "textworld" else real(name, *a))
    with pytest.raises(ConfigError, match=r"needs textworld.*scripts/install_alfworld.sh"):
        alf_env.AlfWorldEnv("valid_seen")
