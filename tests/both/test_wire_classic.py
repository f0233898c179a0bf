"""Classic NSQ on both clusters: MPUB (``publish_many``) and DPUB
(``delay=``), with the fields a classic message has, on the dev cluster's classic mode and on
the real nsqd/nsqlookupd 1.3.0.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from both_support import Collector, consume, consuming, first_copies, producer
from support import bounded, fresh_name

SECOND = 1_000_000_000
CLASSIC = pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)


@CLASSIC
async def test_publish_many_on_classic(nsq_any_cluster: Any) -> None:
    """An MPUB batch arrives whole, each message with classic fields: a 16-hex-digit id,
    no internal id, trace id or partition, attempts 1, a timestamp in nanoseconds."""
    cluster = nsq_any_cluster
    topic = fresh_name("classic-mpub")
    await cluster.create_topic(topic, channels=["ch"])
    bodies = [b"batch-%d" % i for i in range(5)]
    before = time.time_ns()
    async with producer(cluster) as pub:
        async with bounded(10):
            result = await pub.publish_many(topic, bodies)
        async with bounded(10):
            single = await pub.publish(topic, b"single")
    after = time.time_ns()
    assert (result.count, result.partition, result.internal_id) == (5, None, None)
    assert single.partition is None and single.internal_id is None
    got = first_copies(await consume(cluster, topic, "ch", 6))
    assert sorted(got) == sorted([*bodies, b"single"])
    for m in got.values():
        assert re.fullmatch(rb"[0-9a-f]{16}", m.id), m.id
        assert (m.internal_id, m.trace_id, m.partition) == (None, None, None)
        assert (m.queue_offset, m.raw_size, m.headers) == (None, None, {})
        assert m.attempts == 1
        assert before - 5 * SECOND <= m.timestamp <= after + 5 * SECOND


@CLASSIC
async def test_deferred_publish_on_classic(nsq_any_cluster: Any) -> None:
    """DPUB (``delay=1``): the message is not delivered before its delay (the real nsqd may
    be seconds late, never early), while one published after it without a delay comes at
    once."""
    cluster = nsq_any_cluster
    topic = fresh_name("classic-dpub")
    await cluster.create_topic(topic, channels=["ch"])
    got = Collector()
    async with consuming(cluster, topic, "ch", got):
        async with producer(cluster) as pub:
            sent = time.time()
            async with bounded(10):
                await pub.publish(topic, b"deferred", delay=1.0)
            async with bounded(10):
                await pub.publish(topic, b"now")
        await got.count(2, timeout=20)
    assert got.bodies[:2] == [b"now", b"deferred"]
    arrived = got.received[got.bodies.index(b"deferred")]
    assert arrived >= sent + 1.0 - 0.05, f"delivered {arrived - sent:.3f} s after the DPUB"
    deferred = got.messages[got.bodies.index(b"deferred")]
    assert deferred.attempts == 1
