"""Each fault injection as a raw-socket client sees it on the real dev-cluster nsqd nodes.

The client is asyncio streams plus smartnsq's sans-I/O codec: nothing of the smartnsq client
stack is involved, so these observations hold for any NSQ client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from smartnsq.devcluster import DevCluster
from smartnsq.protocol import commands
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.frames import ErrorFrame, FrameReader, MessageFrame, Response

V1 = {"Accept": "application/vnd.nsq; version=1.0"}
TIMEOUT = 5.0


class Raw:
    """A raw NSQ client connection: bytes from the codec, frames back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = FrameReader()
        self.frames: list[Any] = []

    @classmethod
    async def open(cls, address: str) -> Raw:
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        raw = cls(reader, writer)
        writer.write(MAGIC_V2 + commands.identify({"feature_negotiation": True,
                                                   "client_id": "raw", "heartbeat_interval":
                                                   30000}))
        assert isinstance(await raw.frame(), Response)
        return raw

    async def frame(self, timeout: float = TIMEOUT) -> Any:
        """The next frame; None when the server closed the connection."""
        while not self.frames:
            try:
                data = await asyncio.wait_for(self.reader.read(65536), timeout)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.frames.extend(self.decoder.feed(data))
        return self.frames.pop(0)

    async def call(self, command: bytes) -> Any:
        self.writer.write(command)
        return await self.frame()

    def close(self) -> None:
        self.writer.close()


@pytest.fixture
async def cluster() -> AsyncIterator[DevCluster]:
    async with DevCluster(nodes=3, lookupds=2) as c:
        yield c


def tcp_address(cluster: DevCluster, node: Any) -> str:
    return cluster.node_info(node).tcp_address


async def test_move_leader_old_leader_refuses_pub_and_sub(cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=2, channels=["c"])
    old = cluster.leader_of("t", 0)
    producer = await Raw.open(tcp_address(cluster, old))
    assert isinstance(await producer.call(commands.pub("t", b"before", 0)), Response)
    new = cluster.move_leader("t", 0)
    answer = await producer.call(commands.pub("t", b"after", 0))
    assert isinstance(answer, ErrorFrame)
    assert answer.payload.startswith(b"E_FAILED_ON_NOT_LEADER")
    answer = await producer.call(commands.pub("t", b"again", 0))  # connection kept (tcp_08)
    assert isinstance(answer, ErrorFrame)
    consumer = await Raw.open(tcp_address(cluster, old))
    answer = await consumer.call(commands.sub("t", "c", 0))
    assert isinstance(answer, ErrorFrame)
    assert answer.payload.startswith(b"E_FAILED_ON_NOT_LEADER")
    assert await consumer.frame() is None  # fatal after SUB (tcp_09)
    on_new = await Raw.open(tcp_address(cluster, new))
    assert isinstance(await on_new.call(commands.pub("t", b"after", 0)), Response)
    # the message written before the move is still there (replicated log)
    assert await on_new.call(commands.sub("t", "c", 0)) == Response(b"OK")
    on_new.writer.write(commands.rdy(2))
    bodies = []
    for _ in range(2):
        msg = await on_new.frame()
        assert isinstance(msg, MessageFrame)
        bodies.append(msg.body)
        on_new.writer.write(commands.fin(msg.id))
    assert bodies == [b"before", b"after"]
    for conn in (producer, consumer, on_new):
        conn.close()


async def test_unwritable_partition_refuses_pub(cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=1)
    producer = await Raw.open(tcp_address(cluster, cluster.leader_of("t", 0)))
    cluster.set_writable("t", 0, False)
    answer = await producer.call(commands.pub("t", b"x", 0))
    assert isinstance(answer, ErrorFrame)
    assert answer.payload.startswith(b"E_FAILED_ON_NOT_WRITABLE")
    cluster.set_writable("t", 0, True)
    producer.close()
    producer = await Raw.open(tcp_address(cluster, cluster.leader_of("t", 0)))
    assert isinstance(await producer.call(commands.pub("t", b"x", 0)), Response)
    producer.close()


async def test_stopped_node_drops_and_refuses_then_keeps_data(cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=1, channels=["c"])
    leader = cluster.leader_of("t", 0)
    address = tcp_address(cluster, leader)
    producer = await Raw.open(address)
    assert isinstance(await producer.call(commands.pub("t", b"kept", 0)), Response)
    await cluster.stop_node(leader)
    assert await producer.frame() is None  # the open connection is gone
    producer.close()
    host, port = address.rsplit(":", 1)
    with pytest.raises(OSError):
        await asyncio.open_connection(host, int(port))
    await cluster.start_node(leader)
    consumer = await Raw.open(address)
    assert await consumer.call(commands.sub("t", "c", 0)) == Response(b"OK")
    consumer.writer.write(commands.rdy(1))
    msg = await consumer.frame()
    assert isinstance(msg, MessageFrame) and msg.body == b"kept"
    consumer.close()


async def test_proxied_connection_faults() -> None:
    async with DevCluster(nodes=1, lookupds=1, proxied=True) as cluster:
        await cluster.create_topic("t", partitions=1, replicas=1, channels=["c"])
        address = cluster.nsqd_tcp_addresses[0]
        assert address != cluster.node_info(0).tcp_address
        producer = await Raw.open(address)
        assert isinstance(await producer.call(commands.pub("t", b"1", 0)), Response)

        cluster.stall(0)  # a silent network: the answer does not come...
        producer.writer.write(commands.pub("t", b"2", 0))
        pending = asyncio.ensure_future(producer.frame())
        done, _ = await asyncio.wait([pending], timeout=0.2)
        assert not done
        cluster.resume(0)  # ...until the network heals
        assert isinstance(await pending, Response)

        cluster.slow(0, 0.05)
        assert isinstance(await producer.call(commands.pub("t", b"3", 0)), Response)
        cluster.slow(0, 0)

        consumer = await Raw.open(address)
        assert await consumer.call(commands.sub("t", "c", 0)) == Response(b"OK")
        assert cluster.cut_connections(0) == 2
        assert await producer.frame() is None and await consumer.frame() is None
        producer.close()
        consumer.close()
        again = await Raw.open(address)  # new connections work at once
        assert isinstance(await again.call(commands.pub("t", b"4", 0)), Response)
        again.close()


async def test_http_publish_through_cluster(cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=2, replicas=1)
    leader = cluster.node_info(cluster.leader_of("t", 1))
    async with httpx.AsyncClient(headers=V1) as client:
        resp = await client.post(f"http://{leader.broadcast_address}:{leader.http_port}/pub",
                                 params={"topic": "t", "partition": "1"}, content=b"x")
    assert (resp.status_code, resp.text) == (200, "OK")


def test_command_line_runs_and_prints_addresses() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "smartnsq", "dev-cluster", "--nodes", "1", "--lookupds", "1",
         "--topic", "demo:1:1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("running"):
                break
        values = dict(line.split("=", 1) for line in lines if "=" in line and " " not in line)
        assert len(values["NSQLOOKUPD_HTTP"].split(",")) == 1
        lookupd = values["NSQLOOKUPD_HTTP"]
        resp = httpx.get(f"http://{lookupd}/lookup", params={"topic": "demo", "access": "w"},
                         headers=V1)
        assert set(resp.json()["partitions"]) == {"0"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=TIMEOUT) == 130  # stopped by Ctrl-C (docs/cli.md)
    finally:
        with proc:  # leaving it closes the pipes
            if proc.poll() is None:
                proc.kill()
                proc.wait()


async def identify_answer(address: str, **extra: Any) -> dict[str, Any]:
    import json

    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(MAGIC_V2 + commands.identify({"feature_negotiation": True, **extra}))
    decoder = FrameReader()
    frames: list[Any] = []
    while not frames:
        frames = decoder.feed(await asyncio.wait_for(reader.read(65536), TIMEOUT))
    writer.close()
    assert isinstance(frames[0], Response)
    answer: dict[str, Any] = json.loads(frames[0].data)
    return answer


async def test_tls_and_auth_reach_every_node() -> None:
    import ssl

    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    auth = {"s3cret": {"identity": "me", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}]}}
    async with DevCluster(nodes=2, lookupds=1, tls=context, auth=auth) as cluster:
        for address in cluster.nsqd_tcp_addresses:
            answer = await identify_answer(address, tls_v1=True)
            assert answer["auth_required"] is True and answer["tls_v1"] is True
    async with DevCluster(nodes=1, lookupds=1) as cluster:
        answer = await identify_answer(cluster.nsqd_tcp_addresses[0], tls_v1=True)
        assert answer["auth_required"] is False and answer["tls_v1"] is False


async def test_classic_node_in_mixed_cluster_is_a_read_only_producer() -> None:
    async with DevCluster(nodes=2, lookupds=1, classic_nodes=1) as cluster:
        classic = cluster.classic_nodes[0]
        producer = await Raw.open(cluster.node_info(classic).tcp_address)
        assert await producer.call(commands.pub("legacy", b"x")) == Response(b"OK")
        producer.close()
        async with httpx.AsyncClient(headers=V1) as client:
            url = f"http://{cluster.lookupd_http_addresses[0]}/lookup"
            data = (await client.get(url, params={"topic": "legacy"})).json()
            assert data["partitions"] == {}
            assert [p["version"] for p in data["producers"]] == ["1.3.0"]
            data = (await client.get(url, params={"topic": "legacy", "access": "w"})).json()
            assert data["producers"] == []  # youzan lookupds hide classic peers from writers


async def test_classic_cluster_topic_on_first_use() -> None:
    async with DevCluster(nodes=2, lookupds=1, mode="classic") as cluster:
        producer = await Raw.open(cluster.nsqd_tcp_addresses[1])
        assert await producer.call(commands.pub("fresh", b"x")) == Response(b"OK")
        producer.close()
        async with httpx.AsyncClient() as client:
            url = f"http://{cluster.lookupd_http_addresses[0]}/lookup"
            data = (await client.get(url, params={"topic": "fresh"})).json()
        assert [f"{p['broadcast_address']}:{p['tcp_port']}" for p in data["producers"]] == [
            cluster.nsqd_tcp_addresses[1]]
        assert "partitions" not in data


async def test_tombstoned_node_disappears_for_writers(cluster: DevCluster) -> None:
    await cluster.create_topic("t", partitions=1, replicas=1)
    cluster.tombstone(cluster.leader_of("t", 0))
    async with httpx.AsyncClient(headers=V1) as client:
        url = f"http://{cluster.lookupd_http_addresses[0]}/lookup"
        assert (await client.get(url, params={"topic": "t", "access": "w"})).json()[
            "partitions"] == {}
        assert set((await client.get(url, params={"topic": "t"})).json()["partitions"]) == {
            "0"}
