"""The async Consumer's iteration and targets, against the dev cluster over real sockets: an
``async for`` body that leaves without answering gives its message back; ``nsqd=`` targets
each get their start position."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from support import WAIT

from smartnsq import Consumer, StartPosition
from smartnsq.message import Message
from smartnsq.protocol import commands
from smartnsq.transport.connection import Connection


async def publish(cluster: Any, topic: str, bodies: list[bytes], partition: int = 0) -> None:
    leader = cluster.node_info(cluster.leader_of(topic, partition))
    host, port = leader.tcp_address.rsplit(":", 1)
    conn = await Connection.connect(host, int(port))
    try:
        for body in bodies:
            await conn.request(commands.pub(topic, body, partition))
    finally:
        await conn.close()


def leader_address(cluster: Any, topic: str, partition: int = 0) -> str:
    return str(cluster.node_info(cluster.leader_of(topic, partition)).tcp_address)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_leaving_an_async_for_requeues_the_unanswered_message(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("iterleave", channels=["ch"])
    await publish(nsq_cluster, "iterleave", [b"a", b"b"])
    # a drain_timeout far beyond the test's bound: close() only returns in time if the
    # message the loop body abandoned was given back
    consumer = Consumer("iterleave", "ch", nsqd=[leader_address(nsq_cluster, "iterleave")],
                        max_in_flight=1, drain_timeout=3600)
    await consumer.start()
    try:
        # explicit aclose: the generator's exit requeues at once
        iterator = consumer.__aiter__()
        first = await asyncio.wait_for(iterator.__anext__(), WAIT)
        await iterator.aclose()  # type: ignore[attr-defined]
        assert first.requeued
        stats = consumer.stats()
        assert stats.requeued == 1 and stats.in_flight == 0

        # a body that raises: the abandoned message is requeued too
        got: list[Message] = []

        async def read() -> None:
            async for msg in consumer:
                got.append(msg)
                raise LookupError("handler bug")

        with pytest.raises(LookupError):
            await asyncio.wait_for(read(), WAIT)
    finally:
        await asyncio.wait_for(consumer.close(), WAIT)
    assert got and got[0].requeued
    assert consumer.stats().in_flight == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_breaking_out_of_async_for_does_not_hold_up_close(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("iterbreak", channels=["ch"])
    await publish(nsq_cluster, "iterbreak", [b"x"])
    consumer = Consumer("iterbreak", "ch", nsqd=[leader_address(nsq_cluster, "iterbreak")],
                        drain_timeout=3600)
    await consumer.start()
    taken: list[Message] = []

    async def read() -> None:
        async for msg in consumer:
            taken.append(msg)
            break

    await asyncio.wait_for(read(), WAIT)
    await asyncio.wait_for(consumer.close(), WAIT)
    assert taken[0].requeued
    assert consumer.stats().requeued == 1


@pytest.mark.nsq_cluster(nodes=2, lookupds=1)
async def test_each_nsqd_target_gets_the_start_position(nsq_cluster: Any) -> None:
    # no channel yet: a subscription without the start position would begin at the end
    await nsq_cluster.create_topic("startboth", partitions=2, channels=())
    a, b = leader_address(nsq_cluster, "startboth", 0), leader_address(nsq_cluster, "startboth", 1)
    if a == b:
        await nsq_cluster.move_leader("startboth", 1)
        b = leader_address(nsq_cluster, "startboth", 1)
    assert a != b
    await publish(nsq_cluster, "startboth", [b"p0-%d" % i for i in range(3)], partition=0)
    await publish(nsq_cluster, "startboth", [b"p1-%d" % i for i in range(3)], partition=1)
    # b comes up only after a subscribed (and recorded its start as done): both targets
    # have partition None, so keying by partition alone made b subscribe without a start
    node_b = nsq_cluster.leader_of("startboth", 1)
    await nsq_cluster.stop_node(node_b)
    got: list[bytes] = []
    first, every = asyncio.Event(), asyncio.Event()

    async def handler(msg: Message) -> None:
        got.append(msg.body)
        if len(got) == 3:
            first.set()
        if len(got) == 6:
            every.set()

    async with Consumer("startboth", "ch", nsqd=[a, b], handler=handler,
                        start=StartPosition.message_count(0), reconnect_delay=0.05,
                        reconnect_delay_max=0.2):
        await asyncio.wait_for(first.wait(), WAIT)
        await nsq_cluster.start_node(node_b)
        await asyncio.wait_for(every.wait(), WAIT)
    assert sorted(got) == sorted([b"p0-%d" % i for i in range(3)]
                                 + [b"p1-%d" % i for i in range(3)])
