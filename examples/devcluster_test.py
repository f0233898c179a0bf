"""Testing your NSQ code against the embedded dev cluster.

Run it as a test file (the ``nsq_cluster`` fixture comes with smartnsq)::

    python -m pytest examples/devcluster_test.py

or as a script, which runs the same scenarios on a cluster it starts itself::

    python examples/devcluster_test.py

To keep the example about the cluster, the "client" is a tiny raw connection built on
smartnsq's sans-I/O codec: discover a partition's leader with ``/lookup``, publish over TCP,
subscribe and read the message back, then move the leader and watch the old one refuse.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from typing import Any

from smartnsq.devcluster import DevCluster
from smartnsq.protocol import commands
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.frames import ErrorFrame, FrameReader, MessageFrame, Response

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = 5.0


class RawConnection:
    """The smallest NSQ connection: send a command, read frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader()
        self.pending: list[Any] = []

    @classmethod
    async def open(cls, address: str) -> RawConnection:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        conn = cls(reader, writer)
        writer.write(MAGIC_V2 + commands.identify({"feature_negotiation": True,
                                                   "client_id": "example"}))
        await conn.next_frame()  # the IDENTIFY answer
        return conn

    async def next_frame(self) -> Any:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), TIMEOUT)
            if not data:
                raise ConnectionError("server closed the connection")
            self.pending.extend(self.frames.feed(data))
        return self.pending.pop(0)

    async def call(self, command: bytes) -> Any:
        self.writer.write(command)
        return await self.next_frame()

    def close(self) -> None:
        self.writer.close()


async def partition_leaders(cluster: DevCluster, topic: str) -> dict[int, str]:
    """Ask a lookupd which node leads each writable partition (what a smart client does)."""
    query = urllib.parse.urlencode({"topic": topic, "access": "w"})
    request = urllib.request.Request(
        f"http://{cluster.lookupd_http_addresses[0]}/lookup?{query}", headers=V1)

    def get() -> Any:  # the standard library's client, in a thread: any HTTP client will do
        with urllib.request.urlopen(request, timeout=TIMEOUT) as resp:
            return json.load(resp)

    answer = await asyncio.to_thread(get)
    return {int(pid): f"{peer['broadcast_address']}:{peer['tcp_port']}"
            for pid, peer in answer["partitions"].items()}


async def publish_and_consume(cluster: DevCluster) -> None:
    await cluster.create_topic("orders", partitions=2, replicas=2, channels=["billing"])
    leaders = await partition_leaders(cluster, "orders")
    assert sorted(leaders) == [0, 1]

    producer = await RawConnection.open(leaders[1])
    answer = await producer.call(commands.pub("orders", b"order #1", partition=1))
    assert isinstance(answer, Response), answer
    producer.close()

    consumer = await RawConnection.open(leaders[1])
    assert await consumer.call(commands.sub("orders", "billing", 1)) == Response(b"OK")
    consumer.writer.write(commands.rdy(1))
    message = await consumer.next_frame()
    assert isinstance(message, MessageFrame) and message.body == b"order #1"
    consumer.writer.write(commands.fin(message.id))
    consumer.close()


async def leader_moves(cluster: DevCluster) -> None:
    await cluster.create_topic("payments", partitions=1, replicas=2)
    old = (await partition_leaders(cluster, "payments"))[0]
    producer = await RawConnection.open(old)
    assert isinstance(await producer.call(commands.pub("payments", b"a", partition=0)),
                      Response)

    cluster.move_leader("payments", 0)  # fault injection: partition 0 changes leader

    answer = await producer.call(commands.pub("payments", b"b", partition=0))
    assert isinstance(answer, ErrorFrame)
    assert answer.payload.startswith(b"E_FAILED_ON_NOT_LEADER")
    producer.close()
    new = (await partition_leaders(cluster, "payments"))[0]  # a client refreshes its lookup
    assert new != old
    producer = await RawConnection.open(new)
    assert isinstance(await producer.call(commands.pub("payments", b"b", partition=0)),
                      Response)
    producer.close()


# -- as pytest tests -------------------------------------------------------------------------

async def test_publish_and_consume(nsq_cluster: DevCluster) -> None:
    await publish_and_consume(nsq_cluster)


async def test_leader_moves(nsq_cluster: DevCluster) -> None:
    await leader_moves(nsq_cluster)


# -- as a script -----------------------------------------------------------------------------

async def main() -> None:
    async with DevCluster(nodes=3, lookupds=2) as cluster:
        print(cluster.describe())
        await publish_and_consume(cluster)
        print("published and consumed through the partition leader: ok")
        await leader_moves(cluster)
        print("old leader refused with E_FAILED_ON_NOT_LEADER after the move: ok")


if __name__ == "__main__":
    asyncio.run(main())
