"""Consumer lifecycle and validation escapes (issue 12); each test names the bullet it covers.

Every public call is bounded (``tests/support.py``): a call that outlives its timeout by more
than 1 s fails the test that provoked it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trustme
from support import bounded

from smartnsq import errors
from smartnsq.consumer import Consumer
from smartnsq.errors import InvalidArgument, ServerError
from smartnsq.message import Message

WAIT = 10.0


@pytest.fixture
async def silent_lookupd() -> AsyncIterator[str]:
    """A lookupd that accepts connections and never answers."""
    held: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_start_returns_at_once_whatever_the_lookupd(silent_lookupd: str) -> None:
    """Bullet "Deadlines don't cover everything": Consumer.start() (documented to return at
    once) blocked 5 s or forever against a silent lookupd."""
    consumer = Consumer("t", "c", lookupd=[silent_lookupd], handler=lambda m: None,
                        lookup_options={"timeout": 30.0, "connect_timeout": 2.0})
    async with bounded(0.0):
        await consumer.start()
    try:
        assert consumer.connection_count == 0 and consumer.error is None
    finally:
        async with bounded(3.0):
            await consumer.close(timeout=2.0)
    assert consumer.closed


def test_a_non_json_ext_filter_is_refused_at_construction() -> None:
    """Bullet "Bad input that escapes validation": a non-JSON ``ext_filter`` was accepted,
    then every connect failed forever and ``join()`` never said."""
    for bad in ({"type": 1, "filter_data": {1, 2}}, {"type": 1, "x": float("nan")}, ["a"]):
        with pytest.raises(InvalidArgument) as info:
            Consumer("t", "c", nsqd=["127.0.0.1:4150"], ext_filter=bad)
        assert info.value.field == "ext_filter"


def test_internal_id_of_a_classic_message_is_a_clear_answer() -> None:
    """Bullet "Bad input that escapes validation": ``Message.internal_id`` raised ValueError
    on classic ids."""
    for classic_id in (b"18a4421414e69000", b"not-a-hex-guid!!"):
        message = Message(1, 1, classic_id, b"body", youzan=False)
        assert message.internal_id is None and message.partition is None
    youzan = Message(1, 1, (5).to_bytes(8, "big") + bytes(8), b"body")
    assert youzan.internal_id == 5


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_subscription_error_retrying_cannot_fix_stops_the_consumer(
        nsq_cluster: Any) -> None:
    """Bullet "TLS verification failure" (the general rule): an error the errors table says is
    not retriable stops the Consumer with ``.error`` set and ``join()`` raising, instead of
    retrying forever. Here the server refuses a plain SUB on an ordered topic that the user
    explicitly asked to read unordered (E_SUB_ORDER_IS_MUST)."""
    await nsq_cluster.create_topic("ordmust", partitions=1, ordered=True, channels=["ch"])
    consumer = Consumer("ordmust", "ch", lookupd=nsq_cluster.lookupd_http_addresses,
                        handler=lambda m: None, ordered=False, reconnect_delay=0.05)
    async with bounded(0.0):
        await consumer.start()
    with pytest.raises(ServerError) as caught:
        async with bounded(WAIT):
            await consumer.join()
    assert caught.value.code == "E_SUB_ORDER_IS_MUST" and consumer.error is caught.value
    assert consumer.closed


@pytest.mark.skipif(not hasattr(errors, "TLSVerificationFailed"),
                    reason="TLSVerificationFailed (not retriable) comes with the wire work")
async def test_a_tls_verification_failure_stops_the_consumer(nsq_cluster_factory: Any) -> None:
    """Bullet "TLS verification failure is retried like a network error": the Consumer
    retried forever with ``.error`` None."""
    ca = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    cluster = await nsq_cluster_factory(nodes=1, lookupds=1, mode="classic", tls=server)
    consumer = Consumer("tlst", "ch", nsqd=cluster.nsqd_tcp_addresses, handler=lambda m: None,
                        tls=True, reconnect_delay=0.05)  # the throwaway CA is not trusted
    async with bounded(0.0):
        await consumer.start()
    with pytest.raises(errors.NSQError) as caught:
        async with bounded(WAIT):
            await consumer.join()
    assert not caught.value.retriable and consumer.error is caught.value  # type: ignore[attr-defined]
