"""Consumer lifecycle, and bad input refused where it is given rather than deep inside; each
test's docstring also says what went wrong without the rule it checks.

Every public call is bounded (``tests/support.py``): a call that outlives its timeout by more
than 1 s fails the test that provoked it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trustme
from support import bounded, wait_until

from smartnsq import Consumer, errors
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
    """Consumer.start() is documented to return at once; against a silent lookupd it once
    blocked 5 s or forever."""
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
    """A non-JSON ``ext_filter`` is refused by validation; it was once accepted, then every
    connect failed forever and ``join()`` never said."""
    for bad in ({"type": 1, "filter_data": {1, 2}}, {"type": 1, "x": float("nan")}, ["a"]):
        with pytest.raises(InvalidArgument) as info:
            Consumer("t", "c", nsqd=["127.0.0.1:4150"], ext_filter=bad)
        assert info.value.field == "ext_filter"


def test_internal_id_of_a_classic_message_is_a_clear_answer() -> None:
    """``Message.internal_id`` is None on classic ids; it once raised ValueError."""
    for classic_id in (b"18a4421414e69000", b"not-a-hex-guid!!"):
        message = Message(1, 1, classic_id, b"body", youzan=False)
        assert message.internal_id is None and message.partition is None
    youzan = Message(1, 1, (5).to_bytes(8, "big") + bytes(8), b"body")
    assert youzan.internal_id == 5


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_a_subscription_error_retrying_cannot_fix_stops_the_consumer(
        nsq_cluster: Any) -> None:
    """An error the errors table says is not retriable stops the Consumer with ``.error`` set
    and ``join()`` raising, instead of retrying forever. Here the server refuses a plain SUB on
    an ordered topic that the user explicitly asked to read unordered (E_SUB_ORDER_IS_MUST)."""
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


async def test_a_tls_verification_failure_stops_the_consumer(nsq_cluster_factory: Any) -> None:
    """A certificate that does not verify stops the Consumer; it once retried forever, as after
    a network error, with ``.error`` None."""
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


# -- closing while a subscription is half-way through its handshake ------------------------------


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_close_ends_in_time_while_the_handshake_never_completes(nsq_cluster: Any) -> None:
    """The node stalls before answering IDENTIFY: close() drops the handshake, in time."""
    await nsq_cluster.create_topic("stuck", partitions=1, channels=["c"])
    nsq_cluster.stall(0)
    connecting = asyncio.Event()

    class Connecting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().split(": ", 1)[-1].startswith("IDENTIFY"):
                connecting.set()

    with _on_log("smartnsq.connection", Connecting()):
        consumer = Consumer("stuck", "c", nsqd=nsq_cluster.nsqd_tcp_addresses,
                            handler=lambda m: None)
        await consumer.start()
        await asyncio.wait_for(connecting.wait(), WAIT)
        async with bounded(1.0):
            await consumer.close(timeout=1.0)
    assert consumer.closed and consumer.connection_count == 0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1, proxied=True)
async def test_close_ends_in_time_when_the_cancel_of_a_handshake_is_swallowed(
        nsq_cluster: Any) -> None:
    """The close arrives in the loop turn the IDENTIFY exchange finishes in, and the node
    stalls right then, so SUB is never answered.

    ``asyncio.wait_for`` (3.10/3.11) returns the inner result when the cancel lands after the
    inner call finished but before the waiter resumed: the subscription's cancel is lost and
    its task goes on to send SUB. The close used to await that task with no bound (SUB's
    ``request_timeout``, then a reconnect pause, well past the close's timeout); it must drop
    that connection itself and keep its deadline."""
    await nsq_cluster.create_topic("swallowed", partitions=1, channels=["c"])
    loop = asyncio.get_running_loop()
    consumer = Consumer("swallowed", "c", nsqd=nsq_cluster.nsqd_tcp_addresses,
                        handler=lambda m: None)
    closing: list[asyncio.Task[None]] = []

    class AtReady(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            # the last line of the connect: the connect's own task ends in this very turn
            if not closing and record.getMessage().split(": ", 1)[-1].startswith("ready"):
                nsq_cluster.stall(0)
                closing.append(loop.create_task(consumer.close(timeout=1.0)))

    with _on_log("smartnsq.connection", AtReady()):
        await consumer.start()
        await wait_until(lambda: bool(closing), WAIT)
        async with bounded(1.0):
            await closing[0]
    assert consumer.closed and consumer.connection_count == 0


@contextlib.contextmanager
def _on_log(name: str, handler: logging.Handler) -> Iterator[None]:
    logger = logging.getLogger(name)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
