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

from smartnsq.backoff import BackoffPolicy, RequeuePolicy
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
    """Publish with every call bounded (start, each publish, close)."""
    producer = Producer(lookupd=cluster.lookupd_http_addresses, timeout=10)
    async with bounded(10):
        await producer.start()
    try:
        for partition, items in bodies.items():
            for body in items:
                async with bounded(10):
                    await producer.publish(topic, body, partition=partition, timeout=10)
    finally:
        async with bounded(5):
            await producer.close()


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


async def _poison_and_healthy(cluster: Any, topic: str, **options: Any) -> tuple[
        Consumer, Watch, dict[str, int], list[Any]]:
    """An ordered topic with a message on partition 0 that always fails; a consumer on it."""
    await cluster.create_topic(topic, partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, topic, {0: [b"poison"]})
    calls: dict[str, int] = defaultdict(int)
    watch = Watch()

    async def handle(message: Message) -> None:
        calls[message.body.decode()] += 1
        watch.poke()
        if message.body == b"poison":
            raise RuntimeError("poison")

    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                        concurrency=4, **FAST, **options)
    async with bounded(1):
        await consumer.start()
    channels = [channel_of(cluster, topic, "ch", p) for p in (0, 1)]
    watch_channels(watch, *channels)
    async with bounded(WAIT):
        await watch.until(lambda: calls["poison"] >= 1, WAIT, "the poison message failed")
    return consumer, watch, calls, channels


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=REAL)
async def test_a_poison_message_pauses_only_its_own_partition(nsq_cluster: Any) -> None:
    """Bullet "Ordered consumption": one failing ordered message paused every partition
    (healthy partitions handled 8-15 messages in 2.7-6.2 s)."""
    consumer, watch, calls, _ = await _poison_and_healthy(
        nsq_cluster, "ordpoison", backoff_policy=BackoffPolicy(initial=60.0, max=120.0))
    try:
        await publish(nsq_cluster, "ordpoison", {1: [f"ok{i}".encode() for i in range(10)]})
        async with bounded(WAIT):
            await watch.until(lambda: all(calls[f"ok{i}"] == 1 for i in range(10)), WAIT,
                              "the healthy partition handled everything")
        assert calls["poison"] == 1  # its own partition waits out its back-off window
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=REAL)
async def test_no_ordered_requeue_loop_without_a_delay_floor(nsq_cluster: Any) -> None:
    """Bullet "Ordered consumption": back-off disabled, an ordered topic and a failing handler
    made ~6,800 redeliveries/s (the server ignores a delayed REQ there). The partition is held
    with RDY 0 for the requeue delay, sent before the REQ, so the server cannot redeliver at
    once; the hold ends and the message comes back."""
    consumer, watch, calls, channels = await _poison_and_healthy(
        nsq_cluster, "ordloop", backoff_policy=BackoffPolicy(enabled=False),
        requeue_policy=RequeuePolicy(initial=0.0))
    poisoned = channels[0]
    try:
        async with bounded(WAIT):
            await watch.until(lambda: poisoned.requeue_count >= 1, WAIT, "the first REQ")
        held = [c.rdy for c in poisoned.consumers]
        assert held == [0] and poisoned.depth == 1 and poisoned.in_flight == 0
        async with bounded(WAIT):
            await watch.until(lambda: calls["poison"] >= 3, WAIT, "redelivered after the hold")
    finally:
        await close(consumer)
