"""Publish and consume on both clusters: the dev cluster and the real servers.

The same bodies run as ``[dev]`` and ``[real]`` (``nsq_any_cluster``); the real case is
skipped without ``$SMARTNSQ_REAL_NSQ``. Topic names are the test's own, since the real
cluster of a shape is shared by the session.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.message import Message

WAIT = 30.0


async def _round_trip(cluster: Any, topic: str, partitions: int, count: int) -> None:
    await cluster.create_topic(topic, partitions=partitions, replicas=1, channels=["ch"])
    got: list[bytes] = []
    watch = Watch()

    async def handle(message: Message) -> None:
        got.append(bytes(message.body))
        watch.poke()

    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for i in range(count):
            async with bounded(10):
                await producer.publish(topic, b"m%d" % i, timeout=10)
    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: len(got) >= count, WAIT, f"{count} messages")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    assert sorted(got) == sorted(b"m%d" % i for i in range(count))


async def test_publish_and_consume_youzan(nsq_any_cluster: Any) -> None:
    await _round_trip(nsq_any_cluster, fresh_name("basic"), partitions=2, count=20)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_publish_and_consume_classic(nsq_any_cluster: Any) -> None:
    await _round_trip(nsq_any_cluster, fresh_name("basic"), partitions=1, count=20)
