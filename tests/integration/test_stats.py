"""Typed snapshots: ``Producer.stats()``, ``Consumer.stats()`` and ``lag()``, and
the sync facade's, against the dev cluster over loopback (the first two on the real servers
too). Waits are on handler pokes."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
from support import WAIT, Watch, bounded, settled_lag

from smartnsq import Consumer, Producer, sync
from smartnsq.errors import NSQError
from smartnsq.message import Message
from smartnsq.observability.counters import PUBLISH_SAMPLE
from smartnsq.observability.stats import ConsumerStats, ProducerStats

FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5}
PER_PARTITION = PUBLISH_SAMPLE  # past the calls whose latency is always observed


def timed_calls(calls: int) -> int:
    """How many of a partition's first ``calls`` publish calls have their latency observed:
    the first PUBLISH_SAMPLE, then one in PUBLISH_SAMPLE."""
    return sum(1 for i in range(calls) if i < PUBLISH_SAMPLE or i % PUBLISH_SAMPLE == 0)


async def test_producer_and_consumer_snapshots_per_partition(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    await cluster.create_topic("st", partitions=2, channels=["ch"])
    async with Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer:
        for partition in (0, 1):
            for i in range(PER_PARTITION):
                async with bounded(10):
                    await producer.publish("st", b"m%d" % i, partition=partition)
        async with bounded(10):
            await producer.publish_many("st", [b"a", b"b", b"c"], partition=1)
        stats = producer.stats()
    assert isinstance(stats, ProducerStats)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.published = 0  # type: ignore[misc]
    assert stats.published == 2 * PER_PARTITION + 3
    p0, p1 = stats.partition("st", 0), stats.partition("st", 1)
    assert p0 is not None and p1 is not None
    assert (p0.published, p1.published) == (PER_PARTITION, PER_PARTITION + 3)
    assert p0.leader in cluster.nsqd_tcp_addresses and p1.leader in cluster.nsqd_tcp_addresses
    assert p1.publish_seconds.count == timed_calls(PER_PARTITION + 1)  # a batch is one call
    assert p0.publish_seconds.sum > 0 and p0.publish_seconds.max < 10
    assert stats.failed == {} and stats.connections >= 1
    assert stats.lookup is not None and stats.lookup.rounds >= 1 and stats.lookup.requests >= 1

    watch = Watch()
    got: list[Message] = []

    def handler(msg: Message) -> None:
        got.append(msg)
        watch.poke()

    total = 2 * PER_PARTITION + 3
    consumer = Consumer("st", "ch", lookupd=cluster.lookupd_http_addresses, handler=handler,
                        max_in_flight=10, **FAST)
    async with consumer:
        await watch.until(lambda: len(got) >= total, 20)
        cs = consumer.stats()
        lag = await settled_lag(consumer)
        with_lag = consumer.stats()
    assert isinstance(cs, ConsumerStats)
    assert cs.received == total and cs.topic == "st" and cs.channel == "ch"
    assert not isinstance(cs, dict)  # a typed value only: attributes, no second names
    by_partition = {p.partition: p for p in cs.partitions}
    assert by_partition[0].received == PER_PARTITION
    assert by_partition[1].received == PER_PARTITION + 3
    assert sum(p.finished + p.in_flight for p in cs.partitions) == total
    assert all(p.node in cluster.nsqd_tcp_addresses and p.connected for p in cs.partitions)
    assert cs.handler_seconds.count >= 1 and cs.handler_seconds.max >= 0
    assert cs.lookup is not None and cs.lag is None
    assert [p.partition for p in lag.partitions] == [0, 1]
    assert all(p.error is None and p.depth == 0 for p in lag.partitions), lag
    assert sum(p.message_count for p in lag.partitions) == total
    assert with_lag.lag is lag


async def test_failed_publishes_are_counted_by_reason(nsq_any_cluster: Any) -> None:
    cluster = nsq_any_cluster
    async with Producer(nsqd=cluster.nsqd_tcp_addresses, timeout=5) as producer:
        with pytest.raises(NSQError):  # refused before anything is sent: not counted
            await producer.publish("bad topic!", b"x")
        with pytest.raises(NSQError):
            async with bounded(5):
                await producer.publish("nosuch", b"x")
        stats = producer.stats()
    assert stats.published == 0
    assert sum(stats.failed.values()) == 1, stats.failed
    [(reason, _)] = stats.failed.items()
    assert reason.startswith("E_") or reason[0].isupper()
    assert stats.lookup is None


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_sync_facades_return_the_snapshots(nsq_cluster: Any) -> None:
    """The facades run on their own loop thread, the dev cluster on the test's: the blocking
    calls are made from a worker thread."""
    cluster = nsq_cluster
    await cluster.create_topic("sts", channels=["ch"])
    handled = threading.Event()

    def run() -> tuple[ProducerStats, ConsumerStats]:
        with sync.Producer(lookupd=cluster.lookupd_http_addresses, timeout=10) as producer:
            producer.publish("sts", b"one")
            pstats = producer.stats()
        consumer = sync.Consumer("sts", "ch", lookupd=cluster.lookupd_http_addresses,
                                 handler=lambda m: handled.set(), **FAST)
        with consumer:
            assert handled.wait(WAIT)
            return pstats, consumer.stats(lag=True)

    pstats, cstats = await asyncio.to_thread(run)
    assert isinstance(pstats, ProducerStats) and pstats.published == 1
    assert isinstance(cstats, ConsumerStats) and cstats.received == 1
    assert cstats.lag is not None and [p.partition for p in cstats.lag.partitions] == [0]
