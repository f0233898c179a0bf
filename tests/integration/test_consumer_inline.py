"""Plain-function handlers, which run inline from ``data_received`` when their lane is idle
(no task per message): the guarantees of the worker path hold there too. Never-skip and
per-partition order, the duplicate first delivery dropped, no FIN before the handler
succeeded, per-partition back-off and hold on ordered topics, the concurrency with handlers
that return awaitables, close() from a handler.

The dev cluster runs with ``ordered_first_delivery_twice`` (the real server's duplicate first
delivery, docs/protocol.md §10.1). Waits are on handler pokes and channel changes; every public
call is bounded (``tests/support.py``).
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded, wait_until, watch_channels

from smartnsq import Consumer, Producer
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy

WAIT = 15.0
REAL = {"ordered_first_delivery_twice": True}
FAST: dict[str, Any] = {"reconnect_delay": 0.05, "reconnect_delay_max": 0.5,
                        "lookup_options": {"poll_interval": 5.0}}


def channel_of(cluster: Any, topic: str, channel: str, partition: int = 0) -> Any:
    return cluster.state.topics[topic].partitions[partition].channels[channel]


async def publish(cluster: Any, topic: str, bodies: dict[int, list[bytes]]) -> None:
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
async def test_plain_handler_ordered_keeps_order_and_drops_the_duplicate(
        nsq_cluster: Any) -> None:
    """Ordered, a plain handler: every message once, in order per partition, the server's
    duplicated first delivery neither handled nor answered, and nothing FINed before the
    handler returned (the handler sees its own message still pending)."""
    cluster = nsq_cluster
    await cluster.create_topic("inord", partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, "inord", {p: [f"{p}:{i}".encode() for i in range(20)]
                                     for p in (0, 1)})
    seen: dict[str, list[int]] = defaultdict(list)
    answered_early: list[Message] = []
    watch = Watch()

    def handle(message: Message) -> None:
        if message.has_responded:
            answered_early.append(message)
        partition, _, seq = message.body.decode().partition(":")
        seen[partition].append(int(seq))
        watch.poke()

    consumer = Consumer("inord", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, **FAST)
    async with bounded(1):
        await consumer.start()
    try:
        channels = [channel_of(cluster, "inord", "ch", p) for p in (0, 1)]
        watch_channels(watch, *channels)
        async with bounded(WAIT):
            await watch.until(lambda: all(c.finish_count >= 20 and c.depth == 0
                                          and c.in_flight == 0 for c in channels),
                              WAIT, "every message finished")
        assert dict(seen) == {"0": list(range(20)), "1": list(range(20))}
        assert answered_early == []
        stats = consumer.stats()
        assert stats.duplicates_dropped == 2 and stats.order_errors == 0
        assert stats.server_errors == {} and stats.handled == 40
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=REAL)
async def test_plain_handler_poison_pauses_only_its_partition_and_is_never_skipped(
        nsq_cluster: Any) -> None:
    """Ordered, a plain handler that raises on one message: REQ (not FIN), its partition
    alone is held (back-off disabled: the requeue delay's RDY 0 hold) and the message comes
    back, again and again, with nothing behind it handled; the other partition flows."""
    cluster = nsq_cluster
    await cluster.create_topic("inpoison", partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, "inpoison", {0: [b"poison", b"after"]})
    calls: dict[str, int] = defaultdict(int)
    watch = Watch()

    def handle(message: Message) -> None:
        calls[message.body.decode()] += 1
        watch.poke()
        if message.body == b"poison":
            raise RuntimeError("poison")

    consumer = Consumer("inpoison", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, backoff_policy=BackoffPolicy(enabled=False),
                        requeue_policy=RequeuePolicy(initial=0.0), **FAST)
    async with bounded(1):
        await consumer.start()
    channels = [channel_of(cluster, "inpoison", "ch", p) for p in (0, 1)]
    watch_channels(watch, *channels)
    poisoned = channels[0]
    try:
        async with bounded(WAIT):
            await watch.until(lambda: poisoned.requeue_count >= 1, WAIT, "the first REQ")
        assert [c.rdy for c in poisoned.consumers] == [0]  # held before the REQ went out
        await publish(cluster, "inpoison", {1: [f"ok{i}".encode() for i in range(10)]})
        async with bounded(WAIT):
            await watch.until(lambda: calls["poison"] >= 3
                              and all(calls[f"ok{i}"] == 1 for i in range(10)), WAIT,
                              "the poison redelivered after each hold, the rest handled")
        assert calls["after"] == 0 and poisoned.finish_count == 0
        assert consumer.stats().handler_errors == calls["poison"]
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_plain_handler_returning_an_awaitable_keeps_the_concurrency(
        nsq_cluster: Any) -> None:
    """A plain function that returns an awaitable: the message is FINed only once the
    awaitable is done, and with concurrency 1 no other message is handled meanwhile."""
    cluster = nsq_cluster
    await cluster.create_topic("inawait", channels=["ch"])
    await publish(cluster, "inawait", {0: [b"a", b"b", b"c"]})
    release = asyncio.Event()
    started: list[bytes] = []
    running = 0
    most = 0
    watch = Watch()

    async def rest() -> None:
        nonlocal running
        await release.wait()
        running -= 1

    def handle(message: Message) -> Any:
        nonlocal running, most
        started.append(message.body)
        running += 1
        most = max(most, running)
        watch.poke()
        return rest()

    consumer = Consumer("inawait", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, max_in_flight=3, **FAST)
    async with bounded(1):
        await consumer.start()
    channel = channel_of(cluster, "inawait", "ch")
    watch_channels(watch, channel)
    try:
        async with bounded(WAIT):
            # (what the consumer has taken in but not handed on signals nothing: polled)
            await wait_until(lambda: consumer.stats().received == 3, WAIT)
        assert started == [b"a"] and channel.finish_count == 0
        assert consumer.stats().queued == 2
        release.set()
        async with bounded(WAIT):
            await watch.until(lambda: channel.finish_count == 3 and channel.in_flight == 0,
                              WAIT, "all three finished")
        assert sorted(started) == [b"a", b"b", b"c"] and most == 1
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_plain_handler_that_closes_the_consumer(nsq_cluster: Any) -> None:
    """A plain handler starts close() (it cannot await it): its own message is still FINed,
    the close ends within its timeout, and nothing else is FINed unhandled."""
    cluster = nsq_cluster
    await cluster.create_topic("inclose", channels=["ch"])
    await publish(cluster, "inclose", {0: [b"%d" % i for i in range(5)]})
    handled: list[bytes] = []
    closing: list[asyncio.Task[None]] = []

    consumer: Consumer

    def handle(message: Message) -> None:
        handled.append(message.body)
        if not closing:
            closing.append(asyncio.get_running_loop().create_task(consumer.close(timeout=3)))

    consumer = Consumer("inclose", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, max_in_flight=1, **FAST)
    async with bounded(1):
        await consumer.start()
    async with bounded(4):
        await consumer.join()
    assert consumer.closed and closing[0].done()
    channel = channel_of(cluster, "inclose", "ch")
    assert channel.finish_count == len(handled) >= 1
    assert channel.depth + channel.in_flight + channel.finish_count == 5
