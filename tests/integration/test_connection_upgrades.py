"""Connection upgrades against the dev cluster: snappy, deflate, TLS (trustme certificates), AUTH.

Every upgrade is checked end to end: the handshake, a publish, and a message consumed through
the upgraded stream (compressible bodies, so snappy really sends compressed chunks).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme
from support import WAIT, bounded

from smartnsq import Producer
from smartnsq.config import ConnectionConfig
from smartnsq.errors import (
    ConnectionClosed,
    ConnectionFailed,
    InvalidArgument,
    PlaintextAuthRefused,
    ServerError,
    TLSVerificationFailed,
)
from smartnsq.protocol import commands
from smartnsq.protocol.frames import MessageFrame
from smartnsq.transport.connection import Connection

SECRET = "s3cret-for-tests"
AUTH_TABLE = {SECRET: {"identity": "tester", "identity_url": "https://example.test/tester",
                       "authorizations": [{"topic": "^allowed_.*$", "channels": [".*"],
                                           "permissions": ["publish", "subscribe"]}]}}
BODY = b"hello " * 200  # compressible


def address(cluster: Any, index: int = 0) -> tuple[str, int]:
    host, port = cluster.nsqd_tcp_addresses[index].rsplit(":", 1)
    return host, int(port)


async def connect(cluster: Any, **config: Any) -> Connection:
    return await Connection.connect(*address(cluster), ConnectionConfig(**config))


async def publish_and_consume(cluster: Any, conn: Connection, topic: str) -> MessageFrame:
    """PUB on ``conn``, then SUB/RDY on it and return the delivered message (FINished)."""
    got: asyncio.Future[MessageFrame] = asyncio.get_running_loop().create_future()

    def on_message(msg: MessageFrame) -> None:
        if not got.done():
            got.set_result(msg)

    conn.on_message = on_message
    partition = 0 if conn.is_youzan else None
    assert await conn.request(commands.pub(topic, BODY, partition), "PUB") == b"OK"
    assert await conn.request(commands.sub(topic, "ch", partition), "SUB") == b"OK"
    conn.send(commands.rdy(1))
    msg = await asyncio.wait_for(got, WAIT)
    assert msg.body == BODY
    conn.send(commands.fin(msg.id))
    assert await conn.request(commands.cls(), "CLS") == b"CLOSE_WAIT"
    return msg


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def client_tls(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ca.configure_trust(context)
    return context


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


# -- compression ------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["youzan", "classic"])
@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression_end_to_end(nsq_cluster_factory: Any, mode: str,
                                      compression: str) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode=mode)
    topic = f"t_{compression}"
    await cluster.create_topic(topic, channels=["ch"])
    conn = await connect(cluster, compression=compression, deflate_level=5)
    try:
        assert conn.compression == compression
        if compression == "deflate":
            assert conn.identify_response.deflate_level == 5
        writes = conn.write_count
        await publish_and_consume(cluster, conn, topic)
        assert conn.write_count > writes
    finally:
        await conn.close()


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compression_declined_by_the_server(nsq_cluster_factory: Any,
                                                  compression: str) -> None:
    # the JSON answer says no upgrade, so no extra OK is awaited (as for TLS in classic tcp_29)
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic",
                                        nsqd_options={compression: False})
    conn = await connect(cluster, compression=compression)
    try:
        assert conn.compression == "none"
        assert await conn.request(commands.pub("cl_plain", b"x"), "PUB") == b"OK"
    finally:
        await conn.close()


# -- TLS --------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["youzan", "classic"])
@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
async def test_tls_end_to_end(nsq_cluster_factory: Any, server_tls: ssl.SSLContext,
                              client_tls: ssl.SSLContext, mode: str, compression: str) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode=mode, tls=server_tls)
    await cluster.create_topic("t_tls", channels=["ch"])
    conn = await connect(cluster, tls=client_tls, compression=compression)
    try:
        assert conn.tls and conn.compression == compression
        await publish_and_consume(cluster, conn, "t_tls")
    finally:
        await conn.close()


async def test_tls_with_a_ca_file(nsq_cluster_factory: Any, server_tls: ssl.SSLContext,
                                  ca_file: str) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls)
    conn = await connect(cluster, tls=True, tls_ca_file=ca_file)
    try:
        assert conn.tls
        assert await conn.request(commands.pub("cl_tls", b"over tls"), "PUB") == b"OK"
    finally:
        await conn.close()


async def test_tls_verifies_by_default(nsq_cluster_factory: Any,
                                       server_tls: ssl.SSLContext) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls)
    with pytest.raises(TLSVerificationFailed) as caught:
        await connect(cluster, tls=True)  # the throwaway CA is not in the system store
    assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)
    # fatal at once, never retried as a network error; one line naming the problem
    error = caught.value
    assert error.fatal and not error.retriable and not error.refresh_lookup
    assert not isinstance(error, ConnectionFailed)
    assert "\n" not in str(error) and "local issuer certificate" in error.reason


async def test_tls_checks_the_host_name(nsq_cluster_factory: Any, server_tls: ssl.SSLContext,
                                        ca_file: str) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls)
    with pytest.raises(TLSVerificationFailed, match=r"nsqd\.example\.test") as caught:
        await connect(cluster, tls=True, tls_ca_file=ca_file,
                      tls_server_hostname="nsqd.example.test")
    assert "Hostname mismatch" in caught.value.reason


async def test_tls_verify_can_be_turned_off(nsq_cluster_factory: Any,
                                            server_tls: ssl.SSLContext) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls)
    conn = await connect(cluster, tls=True, tls_verify=False)
    try:
        assert conn.tls
        assert await conn.request(commands.pub("cl_tls", b"x"), "PUB") == b"OK"
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_tls_not_offered(nsq_cluster: Any, client_tls: ssl.SSLContext) -> None:
    with pytest.raises(ConnectionFailed, match="does not offer TLS"):
        await connect(nsq_cluster, tls=client_tls)
    # classic tcp_29: tls_v1:false, no upgrade and no extra OK; going on in plaintext
    conn = await connect(nsq_cluster, tls=client_tls, tls_required=False)
    try:
        assert not conn.tls
        assert await conn.request(commands.pub("cl_plain", b"x"), "PUB") == b"OK"
    finally:
        await conn.close()


# -- AUTH -------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["youzan", "classic"])
async def test_auth(nsq_cluster_factory: Any, mode: str,
                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode=mode, auth=AUTH_TABLE)
    await cluster.create_topic("allowed_t", channels=["ch"])
    config = ConnectionConfig(auth_secret=SECRET, allow_plaintext_auth=True)
    assert SECRET not in repr(config)
    conn = await Connection.connect(*address(cluster), config)
    try:
        assert conn.identify_response.auth_required
        auth = conn.auth_response
        assert auth is not None and auth.identity == "tester" and auth.permission_count == 1
        await publish_and_consume(cluster, conn, "allowed_t")
    finally:
        await conn.close()
    client_logs = [r.getMessage() for r in caplog.records
                   if not r.name.startswith("smartnsq.devcluster")]
    assert client_logs and not any(SECRET in text for text in client_logs)


async def test_auth_with_all_upgrades(nsq_cluster_factory: Any, server_tls: ssl.SSLContext,
                                      client_tls: ssl.SSLContext) -> None:
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls,
                                        auth=AUTH_TABLE)
    conn = await connect(cluster, tls=client_tls, compression="deflate", auth_secret=SECRET)
    try:
        assert conn.tls and conn.compression == "deflate" and conn.auth_response is not None
        assert await conn.request(commands.pub("allowed_x", BODY), "PUB") == b"OK"
    finally:
        await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic", auth=AUTH_TABLE)
async def test_auth_refused(nsq_cluster: Any) -> None:
    with pytest.raises(ServerError) as caught:
        await connect(nsq_cluster, auth_secret="wrong", allow_plaintext_auth=True)
    assert caught.value.code == "E_AUTH_FAILED" and caught.value.fatal
    assert "wrong" not in str(caught.value)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic", auth=AUTH_TABLE)
async def test_auth_required_without_a_secret(nsq_cluster: Any) -> None:
    with pytest.raises(InvalidArgument, match="auth_secret"):
        await connect(nsq_cluster)


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic", auth=AUTH_TABLE)
async def test_unauthorized_topic_is_fatal(nsq_cluster: Any) -> None:
    conn = await connect(nsq_cluster, auth_secret=SECRET, allow_plaintext_auth=True)
    with pytest.raises(ServerError) as caught:
        await conn.request(commands.pub("other_t", b"x"), "PUB")
    assert caught.value.code == "E_UNAUTHORIZED" and caught.value.fatal
    assert conn.is_closed
    with pytest.raises(ConnectionClosed):
        await conn.request(commands.pub("allowed_t", b"x"), "PUB")
    await conn.close()


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, mode="classic")
async def test_secret_not_sent_when_auth_is_not_required(nsq_cluster: Any) -> None:
    # sending AUTH here would be fatal E_AUTH_DISABLED (classic tcp_25)
    conn = await connect(nsq_cluster, auth_secret=SECRET)
    try:
        assert conn.auth_response is None
        assert await conn.request(commands.pub("cl_t", b"x"), "PUB") == b"OK"
    finally:
        await conn.close()


@pytest.mark.parametrize("mode", ["youzan", "classic"])
async def test_auth_over_plaintext_is_refused_by_default(nsq_cluster_factory: Any,
                                                         mode: str) -> None:
    # before: the secret went to any plaintext server that asked, without a word
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode=mode, auth=AUTH_TABLE)
    table = cluster.nodes[0].auth
    asked: list[str] = []
    lookup = table.lookup
    table.lookup = lambda secret: asked.append(secret) or lookup(secret)  # observe only
    with pytest.raises(PlaintextAuthRefused, match="allow_plaintext_auth=True") as caught:
        await connect(cluster, auth_secret=SECRET)
    error = caught.value
    assert error.fatal and not error.retriable and not error.refresh_lookup
    assert SECRET not in str(error)
    assert not asked  # the server's auth table was never consulted: no AUTH was sent


async def test_publish_raises_a_tls_verification_failure_at_once(
        nsq_cluster_factory: Any, server_tls: ssl.SSLContext) -> None:
    # before: retried like a network error, raised only at the call's deadline (as Timeout)
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server_tls)
    async with Producer(nsqd=cluster.nsqd_tcp_addresses, tls=True) as producer, bounded(0.0):
        with pytest.raises(TLSVerificationFailed):
            await producer.publish("cl_tls", b"x", timeout=5)
