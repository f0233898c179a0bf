"""A lookupd address whose peer answers and is not nsqlookupd (nsqd's TCP or HTTP port, some
other web server) is a configuration error: with every lookupd of that kind, the producer and
the consumer fail at once with what answered; with one real lookupd among them, they work and
log each wrong one once. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
from support import bounded

from smartnsq import Consumer, Producer
from smartnsq.errors import LookupFailed, Timeout
from smartnsq.testing.hostile import _Peer

PAGE = b"<!DOCTYPE html>\r\n<html><head><title>Welcome</title></head><body>hi</body></html>\r\n"


class WebServer(_Peer):
    """Some HTTP server that is not nsqlookupd: an HTML page (404) to every request."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(PAGE) + PAGE)
            await writer.drain()


def wrong_ones(cluster: Any, web: WebServer) -> dict[str, str]:
    """Each wrong address, with the part of the sentence its error must carry."""
    return {cluster.nsqd_tcp_addresses[0]: "this looks like nsqd's TCP port (usually 4150)",
            cluster.nsqd_http_addresses[0]: "this looks like nsqd's HTTP port (usually 4151)",
            web.address: "not nsqlookupd"}


ASK = "is this nsqlookupd's HTTP port (usually 4161)?"
# the default publish timeout (10 s) and no discovery_timeout: only failing fast fits the bound
FAST = 3.0


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
@pytest.mark.parametrize("kind", [0, 1, 2, "all"])
async def test_producer_fails_fast_when_no_lookupd_is_one(nsq_cluster: Any,
                                                          kind: Any) -> None:
    await nsq_cluster.create_topic("t")
    async with WebServer() as web:
        wrong = wrong_ones(nsq_cluster, web)
        chosen = list(wrong) if kind == "all" else [list(wrong)[kind]]
        async with Producer(lookupd=chosen) as producer:
            with pytest.raises(LookupFailed) as info:
                async with bounded(FAST):
                    await producer.publish("t", b"x")
    error = info.value
    assert not error.retriable
    text = str(error)
    assert ASK in text
    for address in chosen:
        assert address in text and wrong[address] in text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
@pytest.mark.parametrize("kind", [0, 1, 2, "all"])
async def test_consumer_fails_fast_when_no_lookupd_is_one(nsq_cluster: Any, kind: Any) -> None:
    await nsq_cluster.create_topic("t")
    async with WebServer() as web:
        wrong = wrong_ones(nsq_cluster, web)
        chosen = list(wrong) if kind == "all" else [list(wrong)[kind]]
        consumer = Consumer("t", "c", lookupd=chosen, handler=lambda m: None)
        await consumer.start()
        try:
            with pytest.raises(LookupFailed) as info:
                async with bounded(FAST):
                    await consumer.join()
        finally:
            await consumer.close()
    assert consumer.error is info.value and not info.value.retriable
    text = str(info.value)
    assert ASK in text
    for address in chosen:
        assert address in text and wrong[address] in text


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_one_real_lookupd_among_wrong_ones(nsq_cluster: Any,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="smartnsq")
    await nsq_cluster.create_topic("t")
    async with WebServer() as web:
        wrong = wrong_ones(nsq_cluster, web)
        lookupds = [*wrong, *nsq_cluster.lookupd_http_addresses]
        got = asyncio.Event()
        async with Producer(lookupd=lookupds) as producer, \
                Consumer("t", "c", lookupd=lookupds,
                         handler=lambda m: got.set()) as consumer:
            for _ in range(3):
                await producer.publish("t", b"x")
            async with bounded(10):
                await got.wait()
            assert consumer.error is None
    for address, sentence in wrong.items():
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING
                    and r.name == "smartnsq.lookup" and address in r.getMessage()]
        # once per client (the producer's lookup manager and the consumer's)
        assert len(warnings) <= 2, [r.getMessage() for r in warnings]
        assert warnings and all(sentence in r.getMessage() for r in warnings)



def closed_port() -> str:
    """A loopback address nothing listens on (a lookupd restarting, say)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_nothing_listening_is_still_retried(nsq_cluster: Any) -> None:
    """A wrong lookupd beside one where nothing listens: that one may be a lookupd coming
    back, so the publish keeps trying until its own timeout."""
    await nsq_cluster.create_topic("t")
    async with Producer(lookupd=[nsq_cluster.nsqd_tcp_addresses[0], closed_port()]) as p:
        with pytest.raises(Timeout) as info:
            async with bounded(1.0):
                await p.publish("t", b"x", timeout=1.0)
    assert "nsqd's TCP port" in str(info.value)  # what the wrong one said is still shown


async def nsqds_ports_fail_fast(cluster: Any) -> None:
    """nsqd's own TCP and HTTP ports as the lookupds: the publish and the consumer fail at
    once, saying which port each one looks like."""
    chosen = [cluster.nsqd_tcp_addresses[0], cluster.nsqd_http_addresses[0]]
    async with Producer(lookupd=chosen) as producer:
        with pytest.raises(LookupFailed) as info:
            async with bounded(FAST):
                await producer.publish("t", b"x")
    assert not info.value.retriable
    assert "this looks like nsqd's TCP port (usually 4150)" in str(info.value)
    assert "this looks like nsqd's HTTP port (usually 4151)" in str(info.value)
    consumer = Consumer("t", "c", lookupd=chosen, handler=lambda m: None)
    await consumer.start()
    try:
        with pytest.raises(LookupFailed) as failed:
            async with bounded(FAST):
                await consumer.join()
    finally:
        await consumer.close()
    assert not failed.value.retriable


@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
async def test_nsqds_ports_youzan(nsq_any_cluster: Any) -> None:
    await nsqds_ports_fail_fast(nsq_any_cluster)


@pytest.mark.nsq_cluster(mode="classic", nodes=1, lookupds=1)
async def test_nsqds_ports_classic(nsq_any_cluster: Any) -> None:
    await nsqds_ports_fail_fast(nsq_any_cluster)
