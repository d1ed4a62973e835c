"""SharedWeights: reads and writes of a learner's parameters exclude each other, a waiting write goes first."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from agentenv.engines.shared_weights import SharedWeights, share_parameters
from agentenv.errors import WeightUpdateError
from agentenv.models import tiny_random_model


def wait_until(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_a_read_yields_the_version_and_a_write_waits_for_it():
    version = [4]
    shared = SharedWeights(lambda: version[0])
    events: list[str] = []

    def write():
        with shared.writing():
            events.append("write")
            version[0] = 5

    with shared.reading() as v:
        assert v == 4
        writer = threading.Thread(target=write)
        writer.start()
        wait_until(lambda: shared._writers_waiting == 1)
        events.append("read ends")
    writer.join(10)
    assert events == ["read ends", "write"]
    with shared.reading() as v:
        assert v == 5
    assert shared.version == 5


def test_a_waiting_write_goes_before_the_next_read():
    """The decode thread reads in a loop: a step must not wait for it to stop decoding."""
    shared = SharedWeights(lambda: 0)
    events: list[str] = []
    stop = threading.Event()
    first = threading.Event()

    def decode():
        while not stop.is_set():
            with shared.reading():
                first.set()
                events.append("read")
                time.sleep(0.002)

    def write():
        requested = events.count("read")
        with shared.writing():
            # in: the read in progress ended, and at most one that began before the request was registered
            events.append(f"write after {events.count('read') - requested} reads")
            time.sleep(0.02)  # no read runs inside a write
            events.append("write ends")

    reader = threading.Thread(target=decode)
    reader.start()
    first.wait(10)
    writer = threading.Thread(target=write)
    writer.start()
    writer.join(10)
    starved = writer.is_alive()
    if not starved:
        wait_until(lambda: events[-1] == "read")  # the reader goes on after the write
    stop.set()
    reader.join(10)
    writer.join(10)
    assert not starved, "the write waited 10 s while reads went on"
    at = next(i for i, e in enumerate(events) if e.startswith("write after"))
    assert events[at] in ("write after 0 reads", "write after 1 reads", "write after 2 reads")
    assert events[at + 1] == "write ends"


def test_shared_parameters_are_the_sources_own_and_modes_stay_apart():
    source, target = tiny_random_model(seed=0).train(), tiny_random_model(seed=1).eval()
    share_parameters(source, target)
    for (name, p), (name_t, q) in zip(source.named_parameters(), target.named_parameters(), strict=True):
        assert name == name_t and q is p
    assert target.get_input_embeddings().weight is target.get_output_embeddings().weight  # tied stays tied
    assert source.training and not target.training
    with torch.no_grad():
        source.model.norm.weight.add_(1.0)  # a write through the learner's module is read through the engine's
        ids = torch.tensor([[1, 2, 3]])
        torch.testing.assert_close(target(ids).logits, source.eval()(ids).logits, rtol=0, atol=0)


def test_models_of_another_shape_are_refused():
    small = tiny_random_model(seed=0)
    other = tiny_random_model(seed=0, hidden_size=small.config.hidden_size * 2)
    with pytest.raises(WeightUpdateError, match="shape"):
        share_parameters(other, small)
