"""``agentenv.engines.build.build_engine``: the one builder behind ``agentenv train`` and ``agentenv eval``."""

from __future__ import annotations

import pytest

from agentenv.engines.base import ContinuationMode
from agentenv.engines.build import build_engine
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.errors import ConfigError
from agentenv.models import tiny_random_model


def test_the_transformers_engine_gets_the_callers_batch_continuation_and_seed():
    engine = build_engine("transformers", model=tiny_random_model(seed=0), seed=7, max_batch_size=3,
                          continuation="recompute")
    assert isinstance(engine, TransformersEngine) and engine.version == 0
    assert (engine._max_batch, engine._continuation) == (3, ContinuationMode.RECOMPUTE)
    again = build_engine("transformers", model=tiny_random_model(seed=0), seed=7)
    assert (again._max_batch, again._continuation) == (32, ContinuationMode.KEEP)  # eval's defaults
    # the seed is the engine's generator's: the same seed draws the same numbers
    assert engine._generator.initial_seed() == again._generator.initial_seed() == 7


@pytest.mark.parametrize("kwargs, needle", [
    ({"kind": "tgi"}, "engine must be one of transformers, vllm, got 'tgi'"),
    ({"kind": "transformers"}, "exactly one of model (in memory) and path (a model folder)"),
    ({"kind": "transformers", "path": "/models/x"}, "the transformers engine decodes a model in memory"),
])
def test_bad_requests_are_config_errors(kwargs, needle):
    with pytest.raises(ConfigError) as err:
        build_engine(**kwargs)
    assert needle in str(err.value)


def test_a_model_and_a_path_together_are_refused():
    with pytest.raises(ConfigError, match="exactly one of model"):
        build_engine("vllm", model=tiny_random_model(seed=0), path="/models/x")
