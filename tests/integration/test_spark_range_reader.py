"""The Spark connector's range reader holds a bounded buffer, however slowly its task takes.

A task reads an ordered range as several pieces at once and yields them in order, so the
pieces ahead of the one being yielded wait in their readers; a slow sink makes even a plain
read wait. Past ``max_buffered`` bytes a reader keeps its FINs until the messages are taken,
and the server's in-flight window (RDY) stops the rest.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from support import WAIT, wait_until

from smartnsq import Producer
from smartnsq.admin import AsyncAdmin
from smartnsq.config import ConnectionConfig
from smartnsq.protocol.commands import StartPosition
from smartnsq.spark.cluster import LeaderInfo
from smartnsq.spark.ranges import RangeReader

BODY = b"x" * 1024
COUNT = 300
RDY = 10


async def open_reader(cluster: Any, topic: str, count: int, *, ordered: bool, rdy: int,
                      max_buffered: int, config: ConnectionConfig | None = None) -> RangeReader:
    """A reader over the whole of a fresh one-partition topic holding ``count`` bodies."""
    await cluster.create_topic(topic, partitions=1, replicas=1, ordered=ordered)
    async with Producer(lookupd=cluster.lookupd_http_addresses) as producer:
        await producer.publish_many(topic, [BODY] * count, partition=0)
    node = cluster.leader_of(topic, 0)
    async with AsyncAdmin(cluster.lookupd_http_addresses) as admin:
        await admin.create_channel(topic, "reader", partition=0)
        await admin.set_offset(topic, "reader", StartPosition.queue_offset(0), partition=0)
    end = cluster.state.topics[topic].partitions[0].log.end_offset
    reader = RangeReader(topic, 0, LeaderInfo(node.host, node.tcp_port, node.http_port),
                         "reader", 0, end, ordered=ordered, ext=False, rdy=rdy,
                         max_buffered=max_buffered, config=config)
    await reader.open()
    return reader


async def test_a_reader_nobody_takes_from_stops_at_its_bound(nsq_cluster: Any) -> None:
    reader = await open_reader(nsq_cluster, "bounded", COUNT, ordered=False, rdy=RDY,
                               max_buffered=20 * (len(BODY) + 256))
    try:
        channel = nsq_cluster.state.topics["bounded"].partitions[0].channels["reader"]
        # the server's window fills with messages the reader keeps unanswered (before: every
        # message was FINed on arrival, and the reader took in all 300)
        # (its 20 FINs answered: they go out together, a turn after the messages came)
        await wait_until(lambda: channel.in_flight == RDY and channel.finish_count >= 20)
        buffered = len(await reader.next_batch(WAIT, whole=True))  # past the bound: > 20
        assert 20 < buffered <= 21 + RDY
        taken = buffered
        offsets: list[int] = []
        while batch := await reader.next_batch(WAIT):
            taken += len(batch)
            offsets += batch.offsets
        assert taken == COUNT and offsets == sorted(set(offsets))
    finally:
        await reader.close()


async def test_an_ordered_piece_read_whole_returns_at_its_bound(nsq_cluster: Any) -> None:
    """``next_batch(whole=True)`` waits for the whole piece, or for the bound: a piece larger
    than the bound does not wait for FINs it holds itself."""
    reader = await open_reader(nsq_cluster, "boundord", 50, ordered=True, rdy=1,
                               max_buffered=10 * (len(BODY) + 256))
    try:
        sizes = []
        while batch := await reader.next_batch(WAIT, whole=True):
            sizes.append(len(batch))
        assert sum(sizes) == 50 and max(sizes) <= 11 + 1
    finally:
        await reader.close()


async def test_held_messages_redelivered_after_msg_timeout_stay_held(nsq_cluster: Any) -> None:
    """The server redelivers what a reader holds past its msg_timeout: those stay held (FINing
    them would open the window to RDY more, every msg_timeout), and the read stays complete
    and in order."""
    reader = await open_reader(nsq_cluster, "heldlong", 100, ordered=False, rdy=RDY,
                               max_buffered=20 * (len(BODY) + 256),
                               config=ConnectionConfig(msg_timeout=1.0))
    try:
        channel = nsq_cluster.state.topics["heldlong"].partitions[0].channels["reader"]
        await wait_until(lambda: channel.in_flight == RDY)
        await wait_until(lambda: channel.timeout_count >= 2 * RDY)  # redelivered twice over
        # nothing new was read past the held window (before: each redelivery was FINed as a
        # duplicate, and the window let new messages in every msg_timeout)
        assert channel.cursor <= 21 + RDY and channel.finish_count <= 21
        taken: list[int] = []
        while batch := await reader.next_batch(WAIT):
            taken += batch.offsets
        assert len(taken) == 100 and taken == sorted(set(taken))
    finally:
        await reader.close()


@pytest.mark.parametrize("mode", ["before", "after", "both", "reset"])
async def test_an_ordered_read_answers_the_duplicate_first_delivery_quietly(
        nsq_cluster_factory: Any, mode: str, caplog: pytest.LogCaptureFixture) -> None:
    """The range reader opens a fresh channel with SUB_ORDERED on every read, so the real
    server's duplicated first delivery comes on every read: the copy that comes after the
    original's FIN is in flight and must be answered, or the read stalls for msg_timeout (30 s
    here, longer than the 10 s each wait allows); the copy that came while the original was in
    flight makes its FIN fail, which is expected and not a warning."""
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, nsqd_options={
        "ordered_first_delivery_twice": mode, "msg_timeout": 30_000})
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    reader = await open_reader(cluster, f"dup{mode}", 20, ordered=True, rdy=1,
                               max_buffered=1 << 20)
    try:
        channel = cluster.state.topics[f"dup{mode}"].partitions[0].channels["reader"]
        offsets: list[int] = []
        while batch := await reader.next_batch(10.0):
            offsets += batch.offsets
        assert len(offsets) == 20 and offsets == sorted(set(offsets))
        assert channel.timeout_count == 0
        await wait_until(lambda: channel.in_flight == 0 and channel.depth == 0)
        assert not [r for r in caplog.records
                    if r.levelno >= logging.WARNING and r.name.startswith("smartnsq")]
    finally:
        await reader.close()
