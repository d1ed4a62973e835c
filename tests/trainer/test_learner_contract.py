"""Every learner backend meets the loop's contract (``PolicyLearner``): the same members, the same signatures."""

from __future__ import annotations

import inspect

import pytest

from agentenv.trainer.learners.config import OptimConfig
from agentenv.trainer.learners.contract import PolicyLearner
from agentenv.trainer.learners.single import Learner

from .conftest import tiny_model

MEMBERS = ("score", "update", "weights_for_engine", "save", "restore")


def _backends() -> list[type]:
    classes: list[type] = [Learner]
    try:
        from agentenv.trainer.learners.openrlhf import OpenRLHFLearner
        from agentenv.trainer.learners.ray_group import RayLearnerGroup
    except Exception as exc:  # pragma: no cover - the train extra installs OpenRLHF
        pytest.skip(f"the DeepSpeed/Ray backends do not import here: {exc}")
    return [*classes, OpenRLHFLearner, RayLearnerGroup]


def _parameters(fn) -> list[tuple[str, object, object]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("member", MEMBERS)
def test_every_backend_has_the_contracts_signature(member):
    expected = _parameters(getattr(PolicyLearner, member))
    for cls in _backends():
        assert _parameters(getattr(cls, member)) == expected, f"{cls.__name__}.{member}"


def test_every_backend_reports_its_version():
    for cls in _backends():
        assert "version" in dir(cls) or "version" in inspect.signature(cls.__init__).parameters, cls.__name__


def test_the_single_process_learner_is_a_policy_learner():
    learner = Learner(tiny_model(0), OptimConfig())
    assert isinstance(learner, PolicyLearner) and learner.version == 0
    assert not isinstance(object(), PolicyLearner)
