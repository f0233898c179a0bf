"""The async Consumer against the dev cluster over real sockets: FIN, REQ and redelivery,
give-up, manual answers, iteration, graceful close, ext headers, SUB_ADVANCED, tracing.

Completion is awaited on events with a timeout; what the server holds is read from the
cluster's state (its channels' in-flight tables), never from the consumer's own view.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from smartnsq.connection import Connection
from smartnsq.consumer import Consumer, StartPosition
from smartnsq.message import AlreadyResponded, Message
from smartnsq.protocol import commands

WAIT = 10.0


async def wait_until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) until ``condition()`` holds, checking it every few milliseconds."""
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), WAIT)


async def publish(cluster: Any, topic: str, bodies: list[bytes], partition: int = 0,
                  headers: dict[str, str] | None = None, trace_id: int | None = None) -> None:
    """Publish straight to the partition's leader over a raw connection."""
    leader = cluster.node_info(cluster.leader_of(topic, partition))
    host, port = leader.tcp_address.rsplit(":", 1)
    conn = await Connection.connect(host, int(port))
    try:
        for body in bodies:
            if headers is not None:
                data = commands.pub_ext(topic, body, headers, partition)
            elif trace_id is not None:
                data = commands.pub_trace(topic, body, trace_id, partition)
            else:
                data = commands.pub(topic, body, partition)
            await conn.request(data)
    finally:
        await conn.close()


def leader_address(cluster: Any, topic: str, partition: int = 0) -> str:
    return str(cluster.node_info(cluster.leader_of(topic, partition)).tcp_address)


def channel_of(cluster: Any, topic: str, channel: str, partition: int = 0) -> Any:
    return cluster.state.topics[topic].partitions[partition].channels[channel]


class Collector:
    """A handler that records messages and signals when ``n`` arrived."""

    def __init__(self, n: int, fail: Callable[[Message], bool] | None = None) -> None:
        self.n = n
        self.messages: list[Message] = []
        self.done = asyncio.Event()
        self.fail = fail

    async def __call__(self, msg: Message) -> None:
        self.messages.append(msg)
        if len(self.messages) >= self.n:
            self.done.set()
        if self.fail is not None and self.fail(msg):
            raise RuntimeError("handler failure (test)")

    async def wait(self) -> None:
        await asyncio.wait_for(self.done.wait(), WAIT)


# -- basics ---------------------------------------------------------------------------------

@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_consume_finishes_every_message(nsq_cluster: Any) -> None:
    await nsq_cluster.create_topic("basic", channels=["ch"])
    bodies = [b"m%d" % i for i in range(50)]
    await publish(nsq_cluster, "basic", bodies)
    got = Collector(50)
    async with Consumer("basic", "ch", nsqd=[leader_address(nsq_cluster, "basic")],
                        handler=got) as consumer:
        await got.wait()
        await wait_until(lambda: consumer.stats()["finished"] == 50)
        channel = channel_of(nsq_cluster, "basic", "ch")
        await wait_until(lambda: not channel.in_flight)
        stats = consumer.stats()
    assert sorted(m.body for m in got.messages) == sorted(bodies)
    assert stats["requeued"] == 0 and stats["in_flight"] == 0
    first = got.messages[0]
    assert first.topic == "basic" and first.channel == "ch" and first.partition == 0
    assert first.node == leader_address(nsq_cluster, "basic")
    assert first.attempts == 1 and first.has_responded and first.finished
    assert first.queue_offset is None and first.headers == {}
