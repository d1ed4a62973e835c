"""A run folder whose config.yaml sets constructor arguments as env fields gives an error that says
where each goes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentenv.errors import ConfigError
from agentenv.trainer.recipe import resumed_config


def test_resume_with_constructor_arguments_as_env_fields_names_the_file_and_where_they_go(tmp_path: Path) -> None:
    # an env section without env.kwargs: the constructor arguments are env fields
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {
        "id": "python_tool", "dataset": "tool_arith_train", "eval_dataset": "tool_arith_eval",
        "max_problem_chars": 2000}}))
    with pytest.raises(ConfigError) as info:
        resumed_config(tmp_path, [])
    message = str(info.value)
    assert message.startswith(f"--resume: {tmp_path / 'config.yaml'}: env: unknown field(s)")
    assert ("dataset is now env.kwargs.dataset; eval_dataset is now env.eval_kwargs.dataset; "
            "max_problem_chars is now env.kwargs.max_problem_chars") in message


def test_an_unknown_field_without_a_known_move_gets_no_hint(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"env": {"id": "python_tool", "datset": "x"}}))
    with pytest.raises(ConfigError, match=r"env: unknown field\(s\) \['datset'\]; known: ") as info:
        resumed_config(tmp_path, [])
    assert "older agentenv" not in str(info.value)
