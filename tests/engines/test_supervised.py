"""SupervisedEngine on the real transformers engine: a dead decode thread is rebuilt from the latest weights."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from agentenv.engines.base import SamplingParams
from agentenv.engines.shared_weights import SharedWeights
from agentenv.engines.supervised import SupervisedEngine, rebuild_from_learner
from agentenv.engines.transformers_engine import TransformersEngine
from agentenv.errors import EngineError, EngineRebuilt
from agentenv.faults import FaultLog, reset_fault_points
from agentenv.models import tiny_random_model
from tests.engines.helpers import full_forward_logprobs

# the injected fault kills the engine's decode thread: pytest reports the thread's exception as a warning
pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")]

PARAMS = SamplingParams(max_new_tokens=8, temperature=1.0, seed=3)
PROMPT = [5, 9, 17, 33]


class Learner:
    """What ``rebuild_from_learner`` reads of a learner: its model, version and weights."""

    def __init__(self, model: torch.nn.Module, version: int) -> None:
        self.model, self.version = model, version

    def weights_for_engine(self):
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


@pytest.fixture
def setup(monkeypatch):
    reset_fault_points()
    learner = Learner(tiny_random_model(seed=1), version=3)  # the latest weights: not the engine's
    engine = TransformersEngine(copy.deepcopy(tiny_random_model(seed=0)), max_batch_size=4)
    log = FaultLog()
    sup = SupervisedEngine(engine, lambda dead: rebuild_from_learner(dead, learner, TransformersEngine), faults=log)
    yield learner, engine, sup, log, monkeypatch
    reset_fault_points()


async def test_a_dead_decode_thread_is_rebuilt_from_the_latest_weights_and_requests_requeued(setup):
    learner, engine, sup, log, monkeypatch = setup
    assert (await sup.generate(PROMPT, PARAMS)).token_ids  # serves before the fault
    monkeypatch.setenv("AGENTENV_FAULT", "engine.decode:2")  # the 2nd decode step from now kills the thread
    reset_fault_points()
    results = await asyncio.gather(*(sup.generate(PROMPT, PARAMS) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(r, EngineRebuilt) for r in results), results  # every in-flight request: requeue
    assert sup.rebuilds == 1 and sup.engine is not engine and sup.requeued == 3
    assert log.total("engine_rebuilds") == 1
    kind, _, recovery, details = log.events[0]
    assert kind == "engine_rebuilds" and 0 < recovery < 30 and details == {"version": 3}
    # the rebuilt engine serves the learner's weights and version: its behaviour log-probs are the learner's
    assert sup.version == 3
    out = await sup.generate(PROMPT, PARAMS)
    assert out.spans[0].version == 3 and out.spans[0].prefix_version == 3
    ref = full_forward_logprobs(learner.model, PROMPT, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)
    # an update through the supervisor reaches the rebuilt engine; one it already serves is skipped
    await sup.update_weights(learner.weights_for_engine(), 3)
    await sup.update_weights(learner.weights_for_engine(), 4)
    assert sup.version == 4
    await sup.close()


async def test_a_dead_engine_decoding_in_place_is_rebuilt_on_the_learners_parameters(monkeypatch):
    reset_fault_points()
    learner = Learner(tiny_random_model(seed=1), version=3)
    lock = SharedWeights(lambda: learner.version)
    engine = TransformersEngine(copy.deepcopy(tiny_random_model(seed=0)), max_batch_size=4)
    engine.serve_in_place(learner.model, lock)
    sup = SupervisedEngine(engine, lambda dead: rebuild_from_learner(dead, learner, TransformersEngine))
    assert (await sup.generate(PROMPT, PARAMS)).token_ids
    monkeypatch.setenv("AGENTENV_FAULT", "engine.decode:2")
    reset_fault_points()
    results = await asyncio.gather(*(sup.generate(PROMPT, PARAMS) for _ in range(2)), return_exceptions=True)
    assert all(isinstance(r, EngineRebuilt) for r in results), results
    assert sup.rebuilds == 1 and sup.engine is not engine and sup.engine.shared_weights is lock
    own = dict(learner.model.named_parameters())
    assert all(p is own[name] for name, p in sup.engine.model.named_parameters())  # no copy made
    learner.version = 4  # a step the learner took: the rebuilt engine serves it without an update
    out = await sup.generate(PROMPT, PARAMS)
    assert out.spans[0].version == 4 and sup.version == 4
    ref = full_forward_logprobs(learner.model, PROMPT, out.token_ids)
    assert torch.allclose(torch.tensor(out.logprobs), ref, atol=1e-4)
    await sup.close()
    reset_fault_points()


async def test_a_request_error_is_not_a_death(setup):
    _, engine, sup, log, _ = setup
    with pytest.raises(EngineError, match="exceeds the context limit") as info:
        await sup.generate(list(range(5000)), PARAMS)
    assert not isinstance(info.value, EngineRebuilt) and sup.rebuilds == 0 and sup.engine is engine
    assert log.total("engine_rebuilds") == 0
    await sup.close()


async def test_an_engine_that_keeps_dying_is_given_up_on(setup):
    learner, _, _, log, monkeypatch = setup
    sup = SupervisedEngine(TransformersEngine(copy.deepcopy(learner.model)),
                           lambda dead: rebuild_from_learner(dead, learner, TransformersEngine),
                           max_rebuilds=2, faults=log)
    monkeypatch.setenv("AGENTENV_FAULT", "engine.decode:*")  # every decode step kills the thread
    for _ in range(2):
        with pytest.raises(EngineRebuilt):
            await sup.generate(PROMPT, PARAMS)
    with pytest.raises(EngineError, match="died 3 times") as info:
        await sup.generate(PROMPT, PARAMS)
    assert not isinstance(info.value, EngineRebuilt) and sup.rebuilds == 2
    with pytest.raises(EngineError, match="died 3 times"):  # and stays given up
        await sup.generate(PROMPT, PARAMS)
    await sup.close()
