"""Math data sets load by name into uniform records with the right answers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agentenv.envs.python_tool.datasets import DATASETS, MathProblem, dataset_names, load_math
from agentenv.errors import DataError

# Rows in the files, less the 2 upstream rows with an empty answer in math_train / simplelr_math_35.
EXPECTED_ROWS = {
    "math_train": 7472,
    "aime_1983_2023": 975,
    "simplelr_math_35": 8521,
    "math500": 500,
    "aime24": 30,
    "aime25": 30,
    "amc23": 40,
    "minerva_math": 272,
    "olympiadbench": 675,
    "gsm8k": 1319,
}


@pytest.mark.parametrize("name", sorted(EXPECTED_ROWS))
def test_every_set_loads_with_unique_ids(name: str, data_dir: Path) -> None:
    ps = load_math(name, data_root=data_dir)
    assert len(ps) == EXPECTED_ROWS[name]
    assert len({p.id for p in ps}) == len(ps)
    assert all(isinstance(p, MathProblem) and p.problem and p.answer and p.source == name for p in ps)


def test_known_answers(data_dir: Path) -> None:
    assert load_math("math_train", data_root=data_dir)[0].answer == "0"
    assert load_math("simplelr_math_35", data_root=data_dir)[0].answer == "118"
    assert load_math("gsm8k", data_root=data_dir)[0].answer == "18"
    assert load_math("amc23", data_root=data_dir)[0].answer == "27"  # 27.0 in the file
    assert load_math("aime25", data_root=data_dir)[0].answer == "70"  # an int in the file
    assert load_math("olympiadbench", data_root=data_dir)[1].answer == "$\\frac{1}{2 n+2}$"
    multi = [p for p in load_math("minerva_math", data_root=data_dir) if p.alternatives]
    assert multi and all(len(p.answers) >= 2 for p in multi)
    assert load_math("minerva_math", data_root=data_dir)[0].answer == "9.6"  # trailing newline stripped


def test_names_and_splits() -> None:
    from agentenv.envs.python_tool.procedural import PROCEDURAL_SETS

    assert set(dataset_names()) == set(EXPECTED_ROWS) | set(PROCEDURAL_SETS)
    assert set(EXPECTED_ROWS) == set(DATASETS)
    assert set(dataset_names("train")) == {"math_train", "aime_1983_2023", "simplelr_math_35", "tool_arith_train",
                                        "tool_expr_train"}
    assert "tool_arith_eval" in dataset_names("eval")


def test_unknown_name_lists_known() -> None:
    with pytest.raises(DataError, match="math500"):
        load_math("nope")


def test_missing_file_is_a_data_error(tmp_path: Path, data_dir: Path) -> None:
    (tmp_path / "math" / "eval").mkdir(parents=True)
    with pytest.raises(DataError, match="does not exist"):
        load_math("aime24", data_root=tmp_path)
    shutil.copy(data_dir / "math" / "eval" / "aime24.jsonl", tmp_path / "math" / "eval")
    assert len(load_math("aime24", data_root=tmp_path)) == 30


def test_malformed_gsm8k_row(tmp_path: Path) -> None:
    (tmp_path / "math" / "eval").mkdir(parents=True)
    (tmp_path / "math" / "eval" / "gsm8k.jsonl").write_text(
        '{"question": "q", "answer": "no marker", "idx": 0}\n'
    )
    with pytest.raises(DataError, match="####"):
        load_math("gsm8k", data_root=tmp_path)
