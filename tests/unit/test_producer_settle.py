"""``Producer._settle``, the end of every written attempt: what it counts is what
``PublishMeter.ok`` counts, and a publish off the wire releases a waiting ``close()``.

``_settle`` does the meter's count itself (the call would cost a pipelined publish over 1% of
its CPU), so the copy is held here to the original: the same calls, the same clock, the same
counts, countdowns and latency samples, for single messages and batches, on several
partitions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from smartnsq import BatchResult, Producer, PublishResult
from smartnsq.errors import ProtocolError
from smartnsq.observability.counters import PUBLISH_SAMPLE, PublishCounts, PublishMeter
from smartnsq.producer.request import BatchRequest, Request


class Clock:
    """A loop clock that moves by a different step at each reading."""

    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += 0.0001 * (self.reads % 7 + 1)
        return self.now


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def producer_on(loop: asyncio.AbstractEventLoop, clock: Clock) -> Producer:
    producer = Producer(nsqd=["127.0.0.1:4150"])
    producer._loop = loop  # (what start() sets)
    producer._now = clock
    return producer


def sent(request: Request, target: int | None) -> Request:
    """``request`` as ``_submit`` leaves it once written (a first attempt, plain OK)."""
    request.target = target
    request.address = ("127.0.0.1", 4150)
    request.traced = False
    return request


def state(counts: PublishCounts) -> tuple[object, ...]:
    latency = counts.latency
    return (counts.published, counts.skip, counts.warm, list(latency.buckets), latency.sum,
            latency.max)


def test_settle_counts_what_publish_meter_ok_counts(loop: asyncio.AbstractEventLoop) -> None:
    clock, twin = Clock(), Clock()
    producer = producer_on(loop, clock)
    meter = PublishMeter()
    calls = 3 * PUBLISH_SAMPLE + 5  # past the warm-up, several countdowns over
    for i in range(calls):
        for target in (0, 1, None):
            start = 50.0 + i
            if i % 5 == 4:
                bodies = [b"a", b"b", b"c"]
                request: Request = BatchRequest("t", bodies, None, None, None, target, 5.0,
                                                start)
            else:
                bodies = [b"x"]
                request = Request("t", b"x", None, target, None, None, None, 5.0, start)
            producer._on_wire += 1
            result = producer._settle(sent(request, target), b"OK")
            assert isinstance(result, BatchResult if len(bodies) > 1 else PublishResult)
            meter.ok("t", target, len(bodies), start, twin)
    assert producer._on_wire == 0
    assert clock.reads == twin.reads  # the same calls were timed
    mine = producer._meter.topics["t"]
    assert set(mine) == set(meter.topics["t"]) == {0, 1, None}
    for target, counts in meter.topics["t"].items():
        assert state(mine[target]) == state(counts)


def test_an_attempt_that_failed_is_off_the_wire_and_not_counted(
        loop: asyncio.AbstractEventLoop) -> None:
    producer = producer_on(loop, Clock())
    producer._on_wire = 2
    producer._drained = loop.create_future()  # close() waiting
    assert producer._settle(sent(Request("t", b"x", None, 0, None, None, None, 5.0, 1.0), 0),
                            None) is None
    assert not producer._drained.done() and producer._meter.topics == {}
    producer._settle(sent(Request("t", b"y", None, 0, None, None, None, 5.0, 1.0), 0), b"OK")
    assert producer._on_wire == 0 and producer._drained.done()
    assert producer._meter.topics["t"][0].published == 1


def test_an_unreadable_answer_is_off_the_wire_and_not_counted(
        loop: asyncio.AbstractEventLoop) -> None:
    producer = producer_on(loop, Clock())
    producer._on_wire = 1
    request = sent(Request("t", b"x", None, 0, 7, None, None, 5.0, 1.0), 0)
    request.traced = True  # a PUB_TRACE: its answer must be a receipt
    with pytest.raises(ProtocolError, match="unexpected publish response"):
        producer._settle(request, b"OK and more")
    assert producer._on_wire == 0 and producer._meter.topics == {}
