"""nsqd 1.3's unix-socket listener and TLS 1.3, on both clusters, from the same test bodies.

The real classic nsqd 1.3.0 runs with ``--tcp-address=PATH`` (a socket in its own temporary
folder; it then has no TCP port and cannot register with nsqlookupd, so clients are given the
path with ``nsqd=``) and with ``--tls-min-version=tls1.3 --tls-required=tcp-https``; the dev
nsqd serves the same socket beside its TCP port and takes a server context whose floor is
TLS 1.3 (the plugin's ``unix_socket=`` and ``tls_min_version=`` shape keys). Every test
publishes through a ``Producer`` and consumes through a ``Consumer`` (or speaks the protocol
on one ``Connection``), so the whole path (IDENTIFY, the TLS and compression switches,
heartbeats) runs over the socket.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterator
from typing import Any

import pytest
from support import WAIT, Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.config import ConnectionConfig
from smartnsq.errors import ConnectionFailed, ServerError, TLSVersionRefused
from smartnsq.message import Message
from smartnsq.model.routes import parse_address
from smartnsq.protocol import commands
from smartnsq.testing.realcluster import RealCluster
from smartnsq.transport.connection import Connection
from smartnsq.transport.http import HttpClient

BODY = b"compressible body " * 100
TLS13 = {"tls": True, "tls_min_version": "tls1.3",
         # TLS required on TCP, as a deployment that raises the floor would have it
         "nsqd_args": ("--tls-required=tcp-https",), "nsqd_options": {"tls_required": True}}


def _clients(tree: Any) -> Iterator[dict[str, Any]]:
    if isinstance(tree, dict):
        if "user_agent" in tree and "client_id" in tree:
            yield tree
        for value in tree.values():
            yield from _clients(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _clients(value)


async def _channel_clients(cluster: Any, topic: str, channel: str) -> list[dict[str, Any]]:
    """What the nsqd negotiated with the clients of ``channel`` (its ``/stats``)."""
    found: list[dict[str, Any]] = []
    async with HttpClient() as http:
        for address in cluster.nsqd_http_addresses:
            answer = await http.request(
                "GET", f"http://{address}/stats",
                params={"format": "json", "topic": topic, "channel": channel},
                timeout=5.0, max_body=1 << 20)
            assert answer.status == 200, answer.body[:200]
            body = json.loads(answer.body)
            found += list(_clients(body.get("data", body)))
    return found


async def _round_trip(cluster: Any, topic: str, count: int = 10,
                      **source_and_options: Any) -> list[dict[str, Any]]:
    """Publish ``count`` bodies and consume them back, both clients given the same source
    (``nsqd=`` or ``lookupd=``) and options; the consumer's ``/stats`` entries while it was
    connected."""
    bodies = [BODY + b"%d" % i for i in range(count)]
    async with Producer(**source_and_options) as producer:
        for body in bodies:
            async with bounded(10):
                await producer.publish(topic, body, timeout=10)
    got: list[bytes] = []
    watch = Watch()

    async def handle(message: Message) -> None:
        got.append(bytes(message.body))
        watch.poke()

    consumer = Consumer(topic, "ch", handler=handle, **source_and_options)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: len(got) >= count, WAIT, f"{count} messages")
        clients = await _channel_clients(cluster, topic, "ch")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    assert sorted(got) == sorted(bodies)
    assert clients, "the consumer's connection is missing from /stats"
    return clients


def _tls13_in_stats(cluster: Any) -> str:
    """How ``/stats`` names a TLS 1.3 client: the real nsqd says ``TLS1.3``, the dev nsqd
    leaves its TLS details empty (docs/devcluster.md)."""
    return "TLS1.3" if isinstance(cluster, RealCluster) else ""


def _socket(cluster: Any) -> str:
    (address,) = cluster.nsqd_unix_addresses
    return str(address)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True)
@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
async def test_publish_and_consume_over_a_unix_socket(nsq_any_cluster: Any,
                                                      compression: str) -> None:
    path = _socket(nsq_any_cluster)
    assert path.startswith("unix:/")
    clients = await _round_trip(nsq_any_cluster, fresh_name("unix"), nsqd=path,
                                compression=compression)
    for client in clients:
        for kind in ("snappy", "deflate"):
            assert client[kind] is (kind == compression), client


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True)
async def test_the_bare_path_spelling_and_heartbeats(nsq_any_cluster: Any) -> None:
    bare = _socket(nsq_any_cluster).removeprefix("unix:")  # go-nsq's and nsqd's spelling
    beats: asyncio.Queue[None] = asyncio.Queue()
    conn = await Connection.connect(*parse_address(bare), ConnectionConfig(heartbeat_interval=1))
    try:
        conn.on_heartbeat = lambda: beats.put_nowait(None)
        assert conn.address_text == f"unix:{bare}"
        for _ in range(2):  # answered with NOP each time: the server keeps the link
            await asyncio.wait_for(beats.get(), WAIT)
        topic = fresh_name("beat")
        assert await conn.request(commands.pub(topic, b"after beats"), "PUB") == b"OK"
        assert not conn.is_closed
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True, **TLS13)
@pytest.mark.parametrize("compression", ["none", "deflate"])
async def test_tls13_over_a_unix_socket(nsq_any_cluster: Any, nsq_test_tls: Any,
                                        compression: str) -> None:
    path = _socket(nsq_any_cluster)
    # a socket has no host name: the certificate's is given (the test CA's is 127.0.0.1)
    options = {"tls": True, "tls_ca_file": nsq_test_tls.ca_file,
               "tls_server_hostname": "127.0.0.1", "tls_min_version": "tls1.3",
               "compression": compression}
    clients = await _round_trip(nsq_any_cluster, fresh_name("unix-tls"), nsqd=path, **options)
    for client in clients:
        assert client["tls"] is True, client
        assert client["tls_version"] == _tls13_in_stats(nsq_any_cluster), client
        if compression != "none":
            assert client[compression] is True, client
    conn = await Connection.connect(*parse_address(path), ConnectionConfig(**options))
    try:
        assert conn.tls_version == "TLSv1.3"
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True, **TLS13)
async def test_plaintext_over_the_socket_is_refused_when_tls_is_required(
        nsq_any_cluster: Any) -> None:
    conn = await Connection.connect(*parse_address(_socket(nsq_any_cluster)))
    try:
        with pytest.raises(ServerError) as raised:
            await conn.request(commands.pub(fresh_name("plain"), b"never"), "PUB")
        assert raised.value.code == "E_INVALID" and "TLS" in str(raised.value)
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, **TLS13)
async def test_tls13_over_tcp_through_lookupd(nsq_any_cluster: Any, nsq_test_tls: Any) -> None:
    topic = fresh_name("tls13")
    await nsq_any_cluster.create_topic(topic, channels=["ch"])
    clients = await _round_trip(nsq_any_cluster, topic,
                                lookupd=nsq_any_cluster.lookupd_http_addresses,
                                tls=nsq_test_tls.client_context(with_cert=False),
                                compression="snappy")
    for client in clients:
        assert client["tls"] is True and client["snappy"] is True, client
        assert client["tls_version"] == _tls13_in_stats(nsq_any_cluster), client
    host, port = parse_address(nsq_any_cluster.nsqd_tcp_addresses[0])
    conn = await Connection.connect(host, port, ConnectionConfig(
        tls=True, tls_ca_file=nsq_test_tls.ca_file))  # our default context reaches 1.3
    try:
        assert conn.tls_version == "TLSv1.3"
    finally:
        await conn.close()


async def _refused_below_tls13(address: str, tls_files: Any) -> None:
    """The server really holds the floor: a client that stops at TLS 1.2 gets no connection,
    and the error names the nsqd and the TLS alert. No retry can cure it (both ends' TLS
    settings decide), so it is a non-retriable ``TLSVersionRefused``, and a publish through
    it fails at once instead of retrying for its whole timeout."""
    capped = tls_files.client_context(with_cert=False)
    capped.maximum_version = ssl.TLSVersion.TLSv1_2
    host, port = parse_address(address)
    with pytest.raises(TLSVersionRefused) as raised:
        async with bounded(5):
            await Connection.connect(host, port, ConnectionConfig(
                tls=capped, tls_server_hostname="127.0.0.1", connect_timeout=5))
    assert address in str(raised.value) and not raised.value.retriable
    assert "PROTOCOL_VERSION" in str(raised.value).upper().replace(" ", "_")
    async with Producer(nsqd=[address], tls=capped, tls_server_hostname="127.0.0.1") as pub:
        with pytest.raises(TLSVersionRefused):
            async with bounded(3):  # the default publish timeout is 10 s
                await pub.publish("t", b"x")


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True, **TLS13)
async def test_a_client_capped_below_tls13_is_refused_on_the_socket(
        nsq_any_cluster: Any, nsq_test_tls: Any) -> None:
    await _refused_below_tls13(_socket(nsq_any_cluster), nsq_test_tls)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, **TLS13)
async def test_a_client_capped_below_tls13_is_refused_on_tcp(nsq_any_cluster: Any,
                                                             nsq_test_tls: Any) -> None:
    await _refused_below_tls13(nsq_any_cluster.nsqd_tcp_addresses[0], nsq_test_tls)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True, fresh=True)
async def test_a_producer_on_a_socket_reconnects_after_the_nsqd_restarts(
        nsq_any_cluster: Any) -> None:
    path, topic = _socket(nsq_any_cluster), fresh_name("unix-restart")
    async with Producer(nsqd=path, reconnect_delay=0.05) as producer:
        async with bounded(10):
            await producer.publish(topic, b"before", timeout=10)
        await nsq_any_cluster.stop_node(0)  # a crash: the real nsqd leaves its socket file
        with pytest.raises(ConnectionFailed) as raised:  # refused, and the error says where
            await Connection.connect(*parse_address(path))
        assert path in str(raised.value)
        await nsq_any_cluster.start_node(0)
        async with bounded(10):
            await producer.publish(topic, b"after", timeout=10)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, unix_socket=True)
async def test_a_socket_node_is_named_by_its_path_everywhere(nsq_any_cluster: Any) -> None:
    """Where a TCP node is ``host:port``, a socket node is ``unix:PATH`` (what
    ``nsqd=`` reads back), never the internal ``PATH:0``: the publish result, the
    producer's and consumer's stats, the message's node."""
    path, topic = _socket(nsq_any_cluster), fresh_name("unix-names")
    got: list[Message] = []
    watch = Watch()

    def handle(message: Message) -> None:
        got.append(message)
        watch.poke()

    async with Producer(nsqd=path) as producer:
        async with bounded(10):
            result = await producer.publish(topic, b"named")
        produced = producer.stats()
    consumer = Consumer(topic, "ch", handler=handle, nsqd=path)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: bool(got), WAIT, "the message")
        consumed = consumer.stats()
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    texts = [result.node, got[0].node, repr(produced), repr(consumed)]
    assert result.node == path and got[0].node == path, texts
    assert all(":0" not in text.replace(path, "") for text in texts), texts
