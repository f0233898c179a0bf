"""Classic NSQ's connection upgrades on both clusters: snappy, deflate, TLS, AUTH.

Each test publishes through a ``Producer`` and consumes through a ``Consumer`` with the same
connection options, then asks the nsqd's ``/stats`` what it negotiated with the consumer
(``snappy``, ``deflate``, ``tls``, ``authed``), so an upgrade the server silently declined
fails the test. On the real side the classic nsqd 1.3.0 runs with ``--tls-cert/--tls-key``
(and ``--tls-client-auth-policy=require-verify``) from a throwaway CA, and with
``--auth-http-address`` pointing at a loopback auth server answering from ``AUTH_TABLE``
(the plugin's ``tls=`` and ``auth=`` shape keys).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from support import Watch, bounded, fresh_name

from smartnsq import Consumer, Producer
from smartnsq.errors import NSQError, PlaintextAuthRefused, SecurityError, ServerError
from smartnsq.message import Message
from smartnsq.transport.http import HttpClient

WAIT = 30.0
SECRET = "s3cret-for-tests"
AUTH_TABLE = {SECRET: {"identity": "tester", "identity_url": "https://example.test/tester",
                       "authorizations": [{"topic": "^allowed-.*$", "channels": [".*"],
                                           "permissions": ["publish", "subscribe"]}]}}
BODY = b"compressible body " * 100


def _clients(tree: Any) -> Iterator[dict[str, Any]]:
    """Every client entry in an nsqd ``/stats`` answer (dicts with a ``user_agent``)."""
    if isinstance(tree, dict):
        if "user_agent" in tree and "client_id" in tree:
            yield tree
        for value in tree.values():
            yield from _clients(value)
    elif isinstance(tree, list):
        for value in tree:
            yield from _clients(value)


async def _consumer_clients(cluster: Any, topic: str, channel: str) -> list[dict[str, Any]]:
    """The client entries of ``channel`` on every nsqd (what the server negotiated)."""
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
                      **options: Any) -> list[dict[str, Any]]:
    """Publish ``count`` bodies and consume them back with ``options`` on both clients;
    returns the consumer's client entries from ``/stats`` taken while it was connected."""
    await cluster.create_topic(topic, channels=["ch"])
    bodies = [BODY + b"%d" % i for i in range(count)]
    async with Producer(lookupd=cluster.lookupd_http_addresses, **options) as producer:
        for body in bodies:
            async with bounded(10):
                await producer.publish(topic, body, timeout=10)
    got: list[bytes] = []
    watch = Watch()

    async def handle(message: Message) -> None:
        got.append(bytes(message.body))
        watch.poke()

    consumer = Consumer(topic, "ch", lookupd=cluster.lookupd_http_addresses, handler=handle,
                        **options)
    async with bounded(10):
        await consumer.start()
    try:
        await watch.until(lambda: len(got) >= count, WAIT, f"{count} messages")
        clients = await _consumer_clients(cluster, topic, "ch")
    finally:
        async with bounded(10):
            await consumer.close(timeout=5)
    assert sorted(got) == sorted(bodies)
    assert clients, "the consumer's connection is missing from /stats"
    return clients


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
@pytest.mark.parametrize("compression", ["snappy", "deflate"])
async def test_compressed_publish_and_consume(nsq_any_cluster: Any, compression: str) -> None:
    clients = await _round_trip(nsq_any_cluster, fresh_name("zip"), compression=compression)
    for client in clients:
        assert client[compression] is True, client
        assert client["snappy" if compression == "deflate" else "deflate"] is False, client


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, tls="require-verify")
@pytest.mark.parametrize("compression", ["none", "snappy", "deflate"])
async def test_tls_with_a_client_certificate(nsq_any_cluster: Any, nsq_test_tls: Any,
                                             compression: str) -> None:
    clients = await _round_trip(nsq_any_cluster, fresh_name("tls"),
                                tls=nsq_test_tls.client_context(), compression=compression)
    for client in clients:
        assert client["tls"] is True, client
        if compression != "none":
            assert client[compression] is True, client


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, tls="require-verify")
async def test_tls_without_the_client_certificate_is_refused(nsq_any_cluster: Any,
                                                             nsq_test_tls: Any) -> None:
    topic = fresh_name("tls-nocert")
    await nsq_any_cluster.create_topic(topic, channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        tls=nsq_test_tls.client_context(with_cert=False)) as producer:
        with pytest.raises(NSQError):
            async with bounded(3):
                await producer.publish(topic, b"refused", timeout=3)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, tls="require-verify")
async def test_a_refused_client_certificate_fails_at_once(nsq_any_cluster: Any,
                                                          nsq_test_tls: Any) -> None:
    topic = fresh_name("tls-nocert")
    await nsq_any_cluster.create_topic(topic, channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        tls=nsq_test_tls.client_context(with_cert=False)) as producer:
        started = time.monotonic()
        with pytest.raises(SecurityError):
            async with bounded(5):
                await producer.publish(topic, b"refused", timeout=5)
    assert time.monotonic() - started < 2.0


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, tls=True, auth=AUTH_TABLE)
async def test_auth_over_tls(nsq_any_cluster: Any, nsq_test_tls: Any) -> None:
    options = {"tls": nsq_test_tls.client_context(with_cert=False), "auth_secret": SECRET,
               "compression": "deflate"}
    clients = await _round_trip(nsq_any_cluster, fresh_name("allowed"), **options)
    for client in clients:
        assert client["tls"] is True and client["deflate"] is True, client
        assert client["authed"] is True and client["auth_identity"] == "tester", client


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, tls=True, auth=AUTH_TABLE)
@pytest.mark.parametrize("case", ["unknown-secret", "topic-not-granted"])
async def test_auth_refusals(nsq_any_cluster: Any, nsq_test_tls: Any, case: str) -> None:
    topic = fresh_name("allowed" if case == "unknown-secret" else "forbidden")
    await nsq_any_cluster.create_topic(topic, channels=["ch"])
    secret = "not-in-the-table" if case == "unknown-secret" else SECRET
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        tls=nsq_test_tls.client_context(with_cert=False),
                        auth_secret=secret) as producer:
        with pytest.raises(ServerError) as raised:
            async with bounded(5):
                await producer.publish(topic, b"refused", timeout=5)
    want = "E_AUTH_FAILED" if case == "unknown-secret" else "E_UNAUTHORIZED"
    assert raised.value.code == want, raised.value
    assert not raised.value.retriable


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1, auth=AUTH_TABLE)
async def test_auth_over_plaintext_only_when_allowed(nsq_any_cluster: Any) -> None:
    clients = await _round_trip(nsq_any_cluster, fresh_name("allowed"), auth_secret=SECRET,
                                allow_plaintext_auth=True, compression="snappy")
    for client in clients:
        assert client["authed"] is True and client["tls"] is False, client
        assert client["snappy"] is True, client
    topic = fresh_name("allowed")
    await nsq_any_cluster.create_topic(topic, channels=["ch"])
    async with Producer(lookupd=nsq_any_cluster.lookupd_http_addresses,
                        auth_secret=SECRET) as producer:
        with pytest.raises(PlaintextAuthRefused):
            async with bounded(5):
                await producer.publish(topic, b"never sent", timeout=5)
