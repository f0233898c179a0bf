"""Ordered consumption against the real server's behaviour (issue 12, item 4 "Ordered
consumption that survives the real server"); each test names the bullet it covers.

The dev cluster runs with ``ordered_first_delivery_twice`` (the real server's duplicate first
delivery, ``real-cluster.md``). Waits are on handler pokes and channel changes; every public
call is bounded (``tests/support.py``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded, watch_channels

from smartnsq.consumer import Consumer
from smartnsq.message import Message
from smartnsq.producer import Producer

WAIT = 15.0
REAL = {"ordered_first_delivery_twice": True}
FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5,
                        "lookup_options": {"poll_interval": 5.0}}


def channel_of(cluster: Any, topic: str, channel: str, partition: int = 0) -> Any:
    return cluster.state.topics[topic].partitions[partition].channels[channel]


async def publish(cluster: Any, topic: str, bodies: dict[int, list[bytes]]) -> None:
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        for partition, items in bodies.items():
            for body in items:
                async with bounded(10):
                    await producer.publish(topic, body, partition=partition, timeout=10)


async def close(consumer: Consumer) -> None:
    async with bounded(5):
        await consumer.close(timeout=3)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=REAL)
async def test_the_duplicate_first_delivery_never_reaches_the_handler(nsq_cluster: Any) -> None:
    """Bullet "Ordered consumption": the real server delivers the first message of a fresh
    ordered channel twice; the handler got [0, 0, 1, ...]."""
    cluster = nsq_cluster
    await cluster.create_topic("ordup", partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, "ordup", {p: [f"{p}:{i}".encode() for i in range(5)]
                                     for p in (0, 1)})
    seen: dict[str, list[int]] = defaultdict(list)
    watch = Watch()

    async def handle(message: Message) -> None:
        partition, _, seq = message.body.decode().partition(":")
        seen[partition].append(int(seq))
        watch.poke()

    consumer = Consumer("ordup", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, concurrency=4, **FAST)
    async with bounded(1):
        await consumer.start()
    try:
        channels = [channel_of(cluster, "ordup", "ch", p) for p in (0, 1)]
        watch_channels(watch, *channels)
        async with bounded(WAIT):
            await watch.until(lambda: all(c.finish_count >= 5 and c.depth == 0
                                          and c.in_flight == 0 for c in channels),
                              WAIT, "every message finished")
        assert dict(seen) == {"0": [0, 1, 2, 3, 4], "1": [0, 1, 2, 3, 4]}
        stats = consumer.stats()
        assert stats["duplicates_dropped"] == 2 and stats["order_errors"] == 0
        assert stats["server_errors"] == 0  # the copy was not FINed (E_FIN_FAILED)
    finally:
        await close(consumer)
