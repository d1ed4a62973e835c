"""Math problem sets by name, as uniform :class:`MathProblem` records.

Files live in ``<data>/math`` (``agentenv.paths.data_dir()``; see docs/architecture.md, "Data"). Each
loader maps its file's own fields to ``(id, problem, answer, source)``; sets that list several
accepted answers (Minerva, OlympiadBench) keep the others in ``alternatives``.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from agentenv.errors import DataError
from agentenv.paths import data_dir


@dataclass(frozen=True)
class MathProblem:
    """One math problem.

    Attributes:
        id: Stable id within its set, ``"<source>/<row id>"``.
        problem: The question text shown to the model.
        answer: The reference final answer (LaTeX or plain text).
        source: The data set name (e.g. ``"math500"``).
        alternatives: Further accepted answers, if the set lists several.
    """

    id: str
    problem: str
    answer: str
    source: str
    alternatives: tuple[str, ...] = ()

    @property
    def answers(self) -> tuple[str, ...]:
        """``answer`` followed by ``alternatives`` (what a grader should accept)."""
        return (self.answer, *self.alternatives)


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _read_json(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as f:
        return json.load(f)


def _clean(s: Any) -> str:
    return str(s).strip()


def _simple(
    rows: Iterable[dict[str, Any]], source: str, q: str = "problem", a: str = "answer", key: str | None = None
):
    return [
        MathProblem(f"{source}/{r[key] if key else i}", _clean(r[q]), _clean(r[a]), source)
        for i, r in enumerate(rows)
    ]


def _amount(s: Any) -> str:
    """``27.0`` -> ``"27"``; other values unchanged."""
    if isinstance(s, float) and s.is_integer():
        return str(int(s))
    return _clean(s)


def _load_math_train(path: Path) -> list[MathProblem]:
    return _simple(_read_json(path), "math_train")


def _load_aime_train(path: Path) -> list[MathProblem]:
    return _simple(_read_json(path), "aime_1983_2023")


def _load_simplelr(path: Path) -> list[MathProblem]:
    import pyarrow.parquet as pq

    out = []
    for i, r in enumerate(pq.read_table(path, columns=["prompt", "reward_model", "extra_info"]).to_pylist()):
        rm = r["reward_model"]
        rm = ast.literal_eval(rm) if isinstance(rm, str) else rm
        prompt = r["prompt"]
        prompt = ast.literal_eval(prompt) if isinstance(prompt, str) else prompt
        users = [m["content"] for m in prompt if m.get("role") == "user"]
        question = (r.get("extra_info") or {}).get("question") or (users[-1] if users else "")
        out.append(
            MathProblem(
                f"simplelr_math_35/{i}", _clean(question), _clean(rm["ground_truth"]), "simplelr_math_35"
            )
        )
    return out


def _load_math500(path: Path) -> list[MathProblem]:
    return _simple(_read_jsonl(path), "math500", key="unique_id")


def _load_aime24(path: Path) -> list[MathProblem]:
    return _simple(_read_jsonl(path), "aime24", key="id")


def _load_aime25(path: Path) -> list[MathProblem]:
    return _simple(_read_jsonl(path), "aime25", key="id")


def _load_amc23(path: Path) -> list[MathProblem]:
    return [
        MathProblem(f"amc23/{r['id']}", _clean(r["problem"]), _amount(r["answer"]), "amc23")
        for r in _read_jsonl(path)
    ]


def _listed(source: str, rows: list[dict[str, Any]], q: str, a: str, key: str | None) -> list[MathProblem]:
    out = []
    for i, r in enumerate(rows):
        answers = [_clean(x) for x in (r[a] if isinstance(r[a], list) else [r[a]])]
        answers = list(dict.fromkeys(x for x in answers if x))
        if not answers:
            raise DataError(f"{source} row {i} has no answer")
        out.append(
            MathProblem(
                f"{source}/{r[key] if key else i}", _clean(r[q]), answers[0], source, tuple(answers[1:])
            )
        )
    return out


def _load_minerva(path: Path) -> list[MathProblem]:
    return _listed("minerva_math", _read_json(path), "problem", "answer", "idx")


def _load_olympiadbench(path: Path) -> list[MathProblem]:
    return _listed("olympiadbench", _read_jsonl(path), "question", "final_answer", "id")


def _load_gsm8k(path: Path) -> list[MathProblem]:
    out = []
    for i, r in enumerate(_read_jsonl(path)):
        if "####" not in r["answer"]:
            raise DataError(f"gsm8k row {i}: answer has no '#### N' line")
        ans = r["answer"].rsplit("####", 1)[1].strip().replace(",", "")
        out.append(MathProblem(f"gsm8k/{r.get('idx', i)}", _clean(r["question"]), ans, "gsm8k"))
    return out


#: name -> (path under <data>/math, loader, split)
DATASETS: dict[str, tuple[str, Callable[[Path], list[MathProblem]], str]] = {
    "math_train": ("train/math_train.json", _load_math_train, "train"),
    "aime_1983_2023": ("train/aime_1983_2023.json", _load_aime_train, "train"),
    "simplelr_math_35": ("train/simplelr_math_35_train.parquet", _load_simplelr, "train"),
    "math500": ("eval/math500.jsonl", _load_math500, "eval"),
    "aime24": ("eval/aime24.jsonl", _load_aime24, "eval"),
    "aime25": ("eval/aime25.jsonl", _load_aime25, "eval"),
    "amc23": ("eval/amc23.jsonl", _load_amc23, "eval"),
    "minerva_math": ("eval/minerva_math_with_answers.json", _load_minerva, "eval"),
    "olympiadbench": ("eval/olympiadbench.jsonl", _load_olympiadbench, "eval"),
    "gsm8k": ("eval/gsm8k.jsonl", _load_gsm8k, "eval"),
}


def dataset_names(split: str | None = None) -> list[str]:
    """Names of the known sets (files and procedural ones), optionally only ``"train"`` or ``"eval"`` ones."""
    from agentenv.envs.python_tool.procedural import PROCEDURAL_SETS

    files = [n for n, (_, _, s) in DATASETS.items() if split is None or s == split]
    procedural = [n for n, spec in PROCEDURAL_SETS.items()
                  if split is None or (split == "eval") == (spec.exclude is not None)]
    return files + procedural


def load_math(name: str, *, data_root: str | os.PathLike[str] | None = None) -> tuple[MathProblem, ...]:
    """Load the math set ``name``.

    Args:
        name: One of :func:`dataset_names`: a file under ``<data>/math`` or a procedural set
            (:mod:`agentenv.envs.python_tool.procedural`, generated by reasoning-gym, no file).
        data_root: The shared data folder (default :func:`agentenv.paths.data_dir`; unused by
            procedural sets).

    Returns:
        The problems in file order (cached per name and folder); rows with an empty answer (two
        in ``math_train`` and ``simplelr_math_35``) are dropped, as they cannot be graded.

    Raises:
        DataError: Unknown name (the message lists the known ones), missing file, or a malformed row.
    """
    if name not in DATASETS:
        from agentenv.envs.python_tool.procedural import PROCEDURAL_SETS, load_procedural

        if name in PROCEDURAL_SETS:
            return load_procedural(name)
        raise DataError(f"unknown math data set {name!r}; known: {', '.join(dataset_names())}")
    return _load_cached(name, str(data_dir(data_root)))


@lru_cache(maxsize=16)
def _load_cached(name: str, root: str) -> tuple[MathProblem, ...]:
    rel, loader, _ = DATASETS[name]
    path = Path(root) / "math" / rel
    if not path.is_file():
        raise DataError(f"math data set {name!r} expects {path}, which does not exist")
    try:
        problems = loader(path)
    except DataError:
        raise
    except (KeyError, ValueError, SyntaxError, TypeError) as exc:
        raise DataError(f"math data set {name!r} ({path}) is malformed: {type(exc).__name__}: {exc}") from exc
    problems = [p for p in problems if p.answer]  # two upstream MATH rows have an empty answer
    if not problems:
        raise DataError(f"math data set {name!r} ({path}) is empty")
    return tuple(problems)
