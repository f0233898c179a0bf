"""A genuine order regression on an ordered subscription, made of a real server's own frames,
on the dev cluster and the real youzan servers from the same bodies.

No server sends an older message after newer ones by itself, so a
:class:`~smartnsq.testing.hostile.ReplayingProxy` stands between the consumer and the
partition's leader and, once the consumer was given ``m3``, sends it the bytes of an earlier
message frame the server wrote (a copy: an ordered partition has one message in flight, so
holding frames back would stall it). What the consumer must do with it
(``smartnsq/consumer/link.py``, ``docs/consumer.md`` "Order is checked"): an older message
redelivered (``attempts`` > 1) after newer ones is an order error, logged at ERROR, counted
in ``stats().order_errors``, passed to ``on_order_error``, and still delivered; the published
messages are each handled once, in order, and nothing is lost.

Two more cases: ``m1``'s *first* delivery frame (``attempts`` 1) resent, byte for byte what a
rewind (``setoffset`` back) sends first, is an order error once ``m4``, not ``m2``, follows it
(what comes next tells a copy from a rewind: ``docs/consumer.md``); and a frame whose id and
offset disagree with ``m3``'s (partition 1's, from a second proxy) is one order error, not the
position ``m4`` is then judged against.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from both_support import FAST, Collector, channel_drained, leader_address, producer
from support import bounded, fresh_name

from smartnsq import Consumer
from smartnsq.message import Message
from smartnsq.model.backoff import BackoffPolicy, RequeuePolicy
from smartnsq.protocol.frames import FrameReader, MessageFrame, MessageLayout
from smartnsq.testing.hostile import ReplayingProxy

TWICE = {"ordered_first_delivery_twice": True}
"""The dev nodes send a backlog's first ordered delivery twice, as the real server does."""

QUICK_RETRY: dict[str, Any] = {"backoff_policy": BackoffPolicy(enabled=False),
                               "requeue_policy": RequeuePolicy(initial=0.0)}
"""A failed ordered message comes back after the consumer's 0.1 s hold (its floor)."""

BODIES = [b"m%d" % i for i in range(6)]
LAYOUT = MessageLayout(youzan=True, ext=False, detail=True)  # SUB_ORDERED, no ext topic


def decode(frame: bytes) -> MessageFrame:
    """A message frame the proxy forwarded, read as the consumer reads it."""
    (message,) = FrameReader(LAYOUT).feed(frame)
    assert isinstance(message, MessageFrame)
    return message


def replay_after(trigger: bytes, pick: Callable[[MessageFrame], bool]) -> Callable[
        [list[bytes]], bytes | None]:
    """``ReplayingProxy``'s ``replay``: once a frame with body ``trigger`` was forwarded, send
    again (once) the first earlier frame ``pick`` chooses."""
    done = False

    def replay(frames: list[bytes]) -> bytes | None:
        nonlocal done
        if done or bytes(decode(frames[-1]).body) != trigger:
            return None
        done = True
        return next(f for f in frames[:-1] if pick(decode(f)))

    return replay


@contextlib.asynccontextmanager
async def through(proxy: ReplayingProxy, topic: str, handler: Any, partition: int = 0,
                  **options: Any) -> AsyncIterator[Consumer]:
    """An ordered consumer of ``partition`` subscribed through ``proxy`` (``nsqd=``)."""
    consumer = Consumer(topic, "ch", nsqd=[proxy.address], partitions=frozenset({partition}),
                        ordered=True, handler=handler, **{**FAST, **options})
    async with bounded(10):
        await consumer.start()
    try:
        yield consumer
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)


async def backlog(cluster: Any, prefix: str, partitions: int = 1) -> str:
    """A fresh ordered topic with channel ``ch`` and ``BODIES`` queued on partition 0 (and
    ``p<n>`` on each other partition ``n``)."""
    topic: str = fresh_name(prefix)
    await cluster.create_topic(topic, partitions=partitions, replicas=1, ordered=True,
                               channels=["ch"])
    async with producer(cluster) as pub:
        for partition, body in [*((0, b) for b in BODIES),
                                *((n, b"p%d" % n) for n in range(1, partitions))]:
            async with bounded(10):
                await pub.publish(topic, body, partition=partition)
    return topic


def records(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "smartnsq.consumer" and r.levelno == level and text in r.getMessage()]


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_an_older_message_redelivered_after_newer_ones_is_an_order_error(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """``m1`` fails once, the server redelivers it (``attempts`` 2) and it is handled; once
    ``m3`` was delivered, the proxy sends that redelivery's frame again: an older message
    redelivered after newer ones."""
    cluster = nsq_any_cluster
    topic = await backlog(cluster, "regress")
    proxy = ReplayingProxy(await leader_address(cluster, topic), replay_after(
        b"m3", lambda m: bytes(m.body) == b"m1" and m.attempts == 2))
    got = Collector(fail=lambda m: bytes(m.body) == b"m1" and m.attempts == 1)
    reported: list[tuple[Message, str]] = []

    def on_order_error(message: Message, text: str) -> None:
        reported.append((message, text))
        got.watch.poke()

    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with bounded(15), proxy, through(proxy, topic, got, **QUICK_RETRY,
                                               on_order_error=on_order_error) as consumer:
            await got.until(lambda: b"m5" in got.bodies, "m5, after the injected copy", 5)
            await channel_drained(cluster, topic, "ch")
            stats = consumer.stats()
    assert proxy.errors == [] and len(proxy.injected) == 1
    copy = decode(proxy.injected[0])
    before = decode(next(f for f in proxy.messages[0] if bytes(decode(f).body) == b"m3"))
    assert (bytes(copy.body), copy.attempts) == (b"m1", 2)

    # the order error: counted once, the hook called once with the copy, logged at ERROR
    assert stats.order_errors == 1
    assert len(reported) == 1
    message, text = reported[0]
    assert (message.id, message.attempts, message.queue_offset) == (
        copy.id, 2, copy.queue_offset)
    assert text == (f"order regression on {topic}/0 at {proxy.address}: internal_id "
                    f"{copy.internal_id} after {before.internal_id}, queue_offset "
                    f"{copy.queue_offset} after {before.queue_offset}")
    assert records(caplog, logging.ERROR, "order regression") == [text]
    assert records(caplog, logging.INFO, "rewound") == []

    # what link.py does with it: reported, then still delivered (at-least-once), right
    # behind m3, as the very object the hook was given; nothing else is handled twice
    assert [(bytes(m.body), m.attempts) for m in got.messages] == [
        (b"m0", 1), (b"m1", 1), (b"m1", 2), (b"m2", 1), (b"m3", 1),
        (b"m1", 2), (b"m4", 1), (b"m5", 1)]
    assert got.messages[5] is message
    handled_once = [m for i, m in enumerate(got.messages) if i not in (1, 5)]
    assert [bytes(m.body) for m in handled_once] == BODIES  # each once, in order
    assert stats.handler_errors == 1 and stats.lost == 0 and stats.in_flight == 0
    # the copy's FIN is refused: the server did not have it in flight
    assert dict(stats.server_errors) == {"E_FIN_FAILED": 1}


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_an_older_first_delivery_resent_after_newer_ones_is_an_order_error(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Once ``m3`` was delivered, the proxy sends ``m1``'s frame again verbatim (attempts 1),
    and the server goes on with ``m4``: not a rewind, which would replay ``m2``, ``m3``. The
    copy is handled (nothing tells what it is before ``m4`` comes), then reported."""
    cluster = nsq_any_cluster
    topic = await backlog(cluster, "regress1")
    proxy = ReplayingProxy(await leader_address(cluster, topic), replay_after(
        b"m3", lambda m: bytes(m.body) == b"m1"))
    got = Collector()
    reported: list[tuple[Message, str]] = []

    def on_order_error(message: Message, text: str) -> None:
        reported.append((message, text))
        got.watch.poke()

    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with bounded(15), proxy, through(proxy, topic, got,
                                               on_order_error=on_order_error) as consumer:
            await got.until(lambda: b"m5" in got.bodies, "m5, after the injected copy", 5)
            await channel_drained(cluster, topic, "ch")
            stats = consumer.stats()
    assert proxy.errors == [] and len(proxy.injected) == 1
    assert (bytes(decode(proxy.injected[0]).body), decode(proxy.injected[0]).attempts) == (
        b"m1", 1)
    # the delivery order itself, whatever the verdict: the copy right behind m3
    assert [bytes(m.body) for m in got.messages] == [b"m0", b"m1", b"m2", b"m3", b"m1",
                                                     b"m4", b"m5"]
    assert records(caplog, logging.INFO, "rewound") == []
    copy = decode(proxy.injected[0])
    before, after = (decode(next(f for f in proxy.messages[0] if bytes(decode(f).body) == body))
                     for body in (b"m3", b"m4"))
    text = (f"order regression on {topic}/0 at {proxy.address}: internal_id "
            f"{copy.internal_id} after {before.internal_id}, queue_offset {copy.queue_offset} "
            f"after {before.queue_offset} (no rewind: the next delivery, internal_id "
            f"{after.internal_id} at queue_offset {after.queue_offset}, goes on from before it)")
    assert stats.order_errors == 1 and [t for _, t in reported] == [text]
    assert reported[0][0] is got.messages[4]  # the copy, as the handler had it
    assert records(caplog, logging.ERROR, "order regression") == [text]
    # the published messages each handled once, in order; the copy's FIN is refused
    assert stats.handler_errors == 0 and stats.lost == 0 and stats.in_flight == 0
    assert dict(stats.server_errors) == {"E_FIN_FAILED": 1}


@pytest.mark.nsq_cluster(nsqd_options=TWICE)
async def test_an_id_and_an_offset_that_disagree_are_one_order_error(
        nsq_any_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Once ``m3`` was delivered, the proxy sends the frame partition 1's leader wrote for
    ``p1`` (read first by a consumer of partition 1 through a second proxy): its internal id
    is above ``m3``'s (the partition is in its high bits) and its queue offset, 0, below.
    One stray frame: one order error, and ``m4``, in order after ``m3``, is none."""
    cluster = nsq_any_cluster
    topic = await backlog(cluster, "regress2", partitions=2)
    first = ReplayingProxy(await leader_address(cluster, topic, 1), lambda frames: None)
    other = Collector()
    async with first, through(first, topic, other, partition=1):
        await other.until(lambda: b"p1" in other.bodies, "p1", timeout=5)
    stray = next(f for f in first.messages[0] if bytes(decode(f).body) == b"p1")
    proxy = ReplayingProxy(await leader_address(cluster, topic, 0),
                           lambda frames: stray if bytes(decode(frames[-1]).body) == b"m3"
                           and stray not in frames else None)
    got = Collector()
    reported: list[tuple[Message, str]] = []

    def on_order_error(message: Message, text: str) -> None:
        reported.append((message, text))
        got.watch.poke()

    with caplog.at_level(logging.INFO, "smartnsq.consumer"):
        async with bounded(15), proxy, through(proxy, topic, got,
                                               on_order_error=on_order_error) as consumer:
            await got.until(lambda: b"m5" in got.bodies, "m5, after the stray frame", 5)
            await channel_drained(cluster, topic, "ch")
            stats = consumer.stats()
    copy = decode(stray)
    before = decode(next(f for f in proxy.messages[0] if bytes(decode(f).body) == b"m3"))
    assert copy.internal_id > before.internal_id and copy.queue_offset == 0
    assert proxy.errors == [] and proxy.injected == [stray]
    assert [bytes(m.body) for m in got.messages] == [*BODIES[:4], b"p1", *BODIES[4:]]
    assert records(caplog, logging.INFO, "rewound") == []
    assert [text for _, text in reported] == [
        f"order regression on {topic}/0 at {proxy.address}: internal_id {copy.internal_id} "
        f"after {before.internal_id}, queue_offset 0 after {before.queue_offset}"]
    assert stats.order_errors == 1
    assert records(caplog, logging.ERROR, "order regression") == [text for _, text in reported]
