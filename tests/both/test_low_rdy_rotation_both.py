"""Fewer ``max_in_flight`` than partitions, every partition busy, on both clusters.

A steady trickle keeps each holder of ``RDY 1`` from ever going idle; the consumer must still
hand RDY round so that every partition is read. The load is the case seen on a real youzan
cluster: 4 partitions, one message a second to each, ``max_in_flight=2`` (before RDY rotated
among busy connections, two of the partitions delivered nothing in 90 s). The publisher's
one-second pace is the workload; every wait is on the handler's pokes. On an ordered topic
the rotation must keep each partition's order and its one message in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.message import Message

PARTITIONS = 4
MAX_IN_FLIGHT = 2
WITHIN = 10.0  # seconds from the consumer's start to each partition's first delivery


async def _publish_every_second(producer: Producer, topic: str, stop: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        for p in range(PARTITIONS):
            await producer.publish(topic, f"{p}:{i}".encode(), partition=p, timeout=10)
        i += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)  # the load's pace, not a wait


@pytest.mark.parametrize("ordered", [False, True], ids=["plain", "ordered"])
async def test_every_busy_partition_delivers_with_max_in_flight_below_them(
        nsq_any_cluster: Any, ordered: bool) -> None:
    cluster = nsq_any_cluster
    topic = fresh_name("lowrdy")
    await cluster.create_topic(topic, partitions=PARTITIONS, replicas=1, ordered=ordered,
                               channels=["ch"])
    first: dict[int, float] = {}
    counts = dict.fromkeys(range(PARTITIONS), 0)
    seqs: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    watch = Watch()

    def handle(message: Message) -> None:
        p, _, seq = message.body.partition(b":")
        counts[int(p)] += 1
        seqs[int(p)].append(int(seq))
        first.setdefault(int(p), time.monotonic())
        watch.poke()

    stop = asyncio.Event()
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        publishing = asyncio.create_task(_publish_every_second(producer, topic, stop))
        consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses,
                            handler=handle, max_in_flight=MAX_IN_FLIGHT,
                            reconnect_delay=0.1, reconnect_delay_max=1.0)
        try:
            async with bounded(10):
                await consumer.start()
            started = time.monotonic()
            # every partition, and then each one again after the others had their turn
            await watch.until(lambda: len(first) == PARTITIONS, WITHIN + 5,
                              "a first delivery on every partition")
            seconds = {p: round(t - started, 1) for p, t in sorted(first.items())}
            print(f"first delivery per partition, s after start: {seconds}")
            assert max(seconds.values()) < WITHIN, seconds
            baseline = dict(counts)
            await watch.until(lambda: all(counts[p] > baseline[p] for p in counts),
                              3 * WITHIN, "a second turn on every partition")
            stats = consumer.stats()
            assert not stats.server_errors, stats.server_errors
            if ordered:  # each partition in order, nothing handled twice
                assert all(s == sorted(set(s)) for s in seqs.values()), seqs
                assert stats.order_errors == 0
        finally:
            stop.set()
            async with bounded(15):
                await publishing
                await consumer.close(timeout=5)
