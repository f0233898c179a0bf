"""Ordered consumption survives the real server's behaviour; each test's docstring also says
what went wrong without the rule it checks.

The dev cluster runs with ``ordered_first_delivery_twice`` (the real server's duplicate first
delivery, docs/protocol.md §10.1). Waits are on handler pokes and channel changes; every public
call is bounded (``tests/support.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from typing import Any

import pytest
from support import Watch, bounded, poke_on_log, watch_channels

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
    """The real server delivers the first message of a fresh ordered channel twice; the
    handler once got [0, 0, 1, ...]."""
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
        assert stats.duplicates_dropped == 2 and stats.order_errors == 0
        assert stats.server_errors == {}  # the copy was not FINed (E_FIN_FAILED)
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
    """One failing ordered message pauses only its partition; it once paused every partition
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
    """Back-off disabled, an ordered topic and a failing handler once made ~6,800
    redeliveries/s (the server ignores a delayed REQ there). The partition is held with RDY 0
    for the requeue delay, sent before the REQ, so the server cannot redeliver at once; the
    hold ends and the message comes back."""
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


# -- the copy that comes after the original's FIN -----------------------------------------------

LATE_DRAIN = 10.0  # a drain of a few messages takes well under a second
LATE_MSG_TIMEOUT = 30_000  # ms: an unanswered copy would hold its partition past LATE_DRAIN


def late_copies(mode: str) -> dict[str, Any]:
    return {"ordered_first_delivery_twice": mode, "msg_timeout": LATE_MSG_TIMEOUT}


async def _drained(watch: Watch, channels: list[Any], count: int) -> None:
    """Every message FINed on every channel, nothing waiting, nothing in flight."""
    async with bounded(LATE_DRAIN):
        await watch.until(lambda: all(c.finish_count >= count and c.depth == 0
                                      and c.in_flight == 0 for c in channels),
                          LATE_DRAIN, "every partition drained")


@pytest.mark.parametrize("inline", [True, False], ids=["plain-handler", "async-handler"])
@pytest.mark.parametrize("mode", ["after", "both", "reset"])
async def test_a_copy_after_the_fin_is_answered_and_the_drain_does_not_stall(
        nsq_cluster_factory: Any, mode: str, inline: bool) -> None:
    """The real server can send the duplicate first delivery after the original's FIN was
    accepted, and then counts it in flight; on an ordered channel nothing else comes until it
    is answered. A consumer that drops that copy unanswered stalls the partition for
    msg_timeout (62 s instead of 2.3 s on the real cluster; here the drain would not end within
    its 10 s bound, msg_timeout being 30 s). The copy is FINed (accepted: no server error),
    never handled, and counted as a duplicate.

    ``reset`` (once in about a hundred real drains): the original's FIN is refused before the
    copy comes; that refusal is part of the duplicate delivery, not a server error (it was
    once counted as one, an ``E_FIN_FAILED`` per partition)."""
    cluster = await nsq_cluster_factory(nodes=2, lookupds=1, nsqd_options=late_copies(mode))
    await cluster.create_topic("ordlate", partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, "ordlate", {p: [f"{p}:{i}".encode() for i in range(10)]
                                       for p in (0, 1)})
    seen: dict[str, list[int]] = defaultdict(list)
    watch = Watch()

    def record(message: Message) -> None:
        partition, _, seq = message.body.decode().partition(":")
        seen[partition].append(int(seq))
        watch.poke()

    async def record_async(message: Message) -> None:
        record(message)

    consumer = Consumer("ordlate", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=record if inline else record_async, concurrency=4, **FAST)
    async with bounded(1):
        await consumer.start()
    try:
        channels = [channel_of(cluster, "ordlate", "ch", p) for p in (0, 1)]
        watch_channels(watch, *channels)
        await _drained(watch, channels, 10)
        assert dict(seen) == {"0": list(range(10)), "1": list(range(10))}
        assert [c.timeout_count for c in channels] == [0, 0]
        stats = consumer.stats()
        copies = 4 if mode == "both" else 2  # "both": one copy of each kind per partition
        assert stats.duplicates_dropped == copies and stats.order_errors == 0
        assert stats.handled == 20 and stats.finished == 20
        assert not stats.server_errors and stats.timed_out == 0, stats.server_errors
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=REAL)
async def test_a_copy_fined_in_vain_is_quiet(nsq_cluster: Any,
                                             caplog: pytest.LogCaptureFixture) -> None:
    """A plain handler answers the original inside the read that brought it and its copy
    (``before``: the copy is not in flight), so the consumer sees the original answered when
    the copy comes and FINs the copy too (it cannot tell this copy from one sent after the
    FIN): the server answers E_FIN_FAILED, which is expected and neither logged above debug
    nor counted as a server error."""
    cluster = nsq_cluster
    await cluster.create_topic("ordvain", partitions=2, ordered=True, channels=["ch"])
    await publish(cluster, "ordvain", {p: [f"{p}:{i}".encode() for i in range(5)]
                                       for p in (0, 1)})
    watch = Watch()
    handled: list[bytes] = []

    def handle(message: Message) -> None:
        handled.append(message.body)
        watch.poke()

    consumer = Consumer("ordvain", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, **FAST)
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    async with bounded(1):
        await consumer.start()
    try:
        channels = [channel_of(cluster, "ordvain", "ch", p) for p in (0, 1)]
        watch_channels(watch, *channels)
        with poke_on_log(watch, "smartnsq.consumer"):
            await _drained(watch, channels, 5)
            async with bounded(WAIT):  # the two E_FIN_FAILED answers, noted at debug
                await watch.until(lambda: len([r for r in caplog.records
                                               if "E_FIN_FAILED" in r.getMessage()]) >= 2,
                                  WAIT, "both copies' FIN answered")
        fin_failed = [r for r in caplog.records if "E_FIN_FAILED" in r.getMessage()]
        assert {r.levelno for r in fin_failed} == {logging.DEBUG}
        assert not [r for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name.startswith("smartnsq")]
        assert sorted(handled) == sorted(f"{p}:{i}".encode() for p in (0, 1) for i in range(5))
        stats = consumer.stats()
        assert stats.duplicates_dropped == 2 and stats.server_errors == {}
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=late_copies("both"))
async def test_a_copy_is_never_fined_before_the_originals_handler_succeeded(
        nsq_cluster: Any) -> None:
    """At-least-once: the copy that comes while the original's handler still runs is not
    answered (it is not in flight: FINing it could only fail), and nothing of the message is
    FINed until the handler returned; the copy that follows the FIN is FINed."""
    cluster = nsq_cluster
    await cluster.create_topic("ordslow", partitions=1, ordered=True, channels=["ch"])
    await publish(cluster, "ordslow", {0: [b"first", b"second"]})
    release = asyncio.Event()
    calls: list[bytes] = []
    watch = Watch()

    async def handle(message: Message) -> None:
        calls.append(message.body)
        watch.poke()
        if message.body == b"first":
            await release.wait()

    consumer = Consumer("ordslow", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, **FAST)
    async with bounded(1):
        await consumer.start()
    try:
        channel = channel_of(cluster, "ordslow", "ch")
        watch_channels(watch, channel)
        with poke_on_log(watch, "smartnsq.consumer"):
            async with bounded(WAIT):
                await watch.until(lambda: calls == [b"first"]
                                  and consumer.stats().duplicates_dropped == 1,
                                  WAIT, "the early copy came while the handler runs")
        assert channel.finish_count == 0 and consumer.stats().finished == 0
        release.set()
        await _drained(watch, [channel], 2)
        assert calls == [b"first", b"second"]
        assert channel.timeout_count == 0
        stats = consumer.stats()
        assert stats.duplicates_dropped == 2 and stats.server_errors == {}
    finally:
        await close(consumer)


@pytest.mark.nsq_cluster(nodes=2, lookupds=1, nsqd_options=late_copies("after"))
async def test_a_copy_after_the_originals_req_is_handled_as_a_delivery(
        nsq_cluster: Any) -> None:
    """The original failed and was requeued; the copy that comes after the REQ may be in
    flight, so it is handled like any delivery (and FINed when that succeeds), then the
    requeued original (attempts 2) is handled again: at-least-once, and no stall."""
    cluster = nsq_cluster
    await cluster.create_topic("ordreq", partitions=1, ordered=True, channels=["ch"])
    await publish(cluster, "ordreq", {0: [b"first", b"second"]})
    calls: list[tuple[bytes, int]] = []
    watch = Watch()

    def handle(message: Message) -> None:
        calls.append((message.body, message.attempts))
        watch.poke()
        if len(calls) == 1:
            raise RuntimeError("the first try fails")

    consumer = Consumer("ordreq", "ch", lookupd=cluster.lookupd_http_addresses,
                        handler=handle, backoff_policy=BackoffPolicy(enabled=False),
                        requeue_policy=RequeuePolicy(initial=0.0), **FAST)
    async with bounded(1):
        await consumer.start()
    try:
        channel = channel_of(cluster, "ordreq", "ch")
        watch_channels(watch, channel)
        await _drained(watch, [channel], 3)  # the copy's FIN, the original's, second's
        assert calls == [(b"first", 1), (b"first", 1), (b"first", 2), (b"second", 1)]
        assert channel.timeout_count == 0 and channel.requeue_count == 1
        stats = consumer.stats()
        assert stats.order_errors == 0 and stats.server_errors == {}
    finally:
        await close(consumer)
