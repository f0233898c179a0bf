"""A handshake whose last answer arrives in the same write as a fatal or corrupt frame fails
``open()`` with an error naming the node instead of returning a closed connection, and a node
whose protocol error once must cost only that node (retried)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import WAIT, Watch, bounded, wait_until

from smartnsq import Consumer, Producer
from smartnsq.errors import NSQError, ProtocolError, ServerError
from smartnsq.testing.hostile import _IDENTIFY_ANSWER, _Nsqd, _Peer, frame
from smartnsq.transport.connection import Connection


class IdentifyThenFatalNsqd(_Nsqd):
    """Answers IDENTIFY and, in the same write, ``trailer`` (a fatal error frame, or bytes that
    are no frame at all); then reads whatever comes and never answers."""

    def __init__(self, trailer: bytes) -> None:
        super().__init__()
        self.trailer = trailer

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        await self.read_command(reader)
        writer.write(frame(json.dumps(_IDENTIFY_ANSWER).encode()) + self.trailer)
        await writer.drain()
        while await reader.read(65536):
            pass


FATAL = frame(b"E_INVALID cannot do that now", 1)
CORRUPT = b"\xff\xff\xff\xf0garbage"


@pytest.mark.parametrize("trailer", [FATAL, CORRUPT], ids=["fatal", "corrupt"])
async def test_open_does_not_return_a_connection_closed_by_its_last_handshake_answer(
        trailer: bytes) -> None:
    async with IdentifyThenFatalNsqd(trailer) as peer:
        conn = Connection(peer.host, peer.port)
        with pytest.raises(NSQError) as info:
            async with bounded(2.0):
                await conn.open()
        assert isinstance(info.value, ServerError if trailer is FATAL else ProtocolError)
        assert conn.is_closed
        # which nsqd said it (the stateful fuzz once met a fatal frame's error naming no node)
        assert peer.address in str(info.value), info.value


@pytest.mark.parametrize("trailer", [FATAL, CORRUPT], ids=["fatal", "corrupt"])
async def test_a_publish_to_such_a_node_ends_within_its_timeout(trailer: bytes) -> None:
    async with IdentifyThenFatalNsqd(trailer) as peer, Producer(nsqd=[peer.address]) as p:
        with pytest.raises(NSQError):
            async with bounded(1.0):
                await p.publish("t", b"x", timeout=1.0)


HTML_PAGE = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nConnection: close\r\n\r\n"
             b"<html>\r\n<head><title>400 Bad Request</title></head>\r\n<body>\r\n"
             b"<center><h1>400 Bad Request</h1></center>\r\n</body>\r\n</html>\r\n")


class HttpOnTcpPort(_Peer):
    """A web server where nsqd's TCP port should be: answers the magic with an HTML 400 and
    keeps the connection open (``keep_open``) or closes it."""

    def __init__(self, keep_open: bool = True) -> None:
        super().__init__()
        self.keep_open = keep_open

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(HTML_PAGE)
        await writer.drain()
        while self.keep_open and await reader.read(65536):
            pass


class HtmlIdentifyNsqd(_Nsqd):
    """Reads the magic and IDENTIFY and answers it with a well-framed HTML page."""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        await self.read_command(reader)
        writer.write(frame(HTML_PAGE.split(b"\r\n\r\n", 1)[1]))
        await writer.drain()
        while await reader.read(65536):
            pass


# "Consumer(nsqd=[healthy, one that answered HTML once]) got 0 of 5 messages from the healthy
# node and join() raised": a node's protocol error is that node's, retried with back-off.
@pytest.mark.nsq_cluster(nodes=1, lookupds=1)
@pytest.mark.parametrize("peer", [HtmlIdentifyNsqd, HttpOnTcpPort])
async def test_a_node_answering_garbage_costs_only_that_node(nsq_cluster: Any,
                                                             peer: type[_Peer]) -> None:
    await nsq_cluster.create_topic("garbled", channels=["ch"])
    healthy = nsq_cluster.node_info(nsq_cluster.leader_of("garbled", 0)).tcp_address
    got: list[bytes] = []
    watch = Watch()

    async def handler(msg: Any) -> None:
        got.append(msg.body)
        watch.poke()

    async with peer() as web:
        consumer = Consumer("garbled", "ch", nsqd=[healthy, web.address], handler=handler,
                            reconnect_delay=0.05, reconnect_delay_max=0.1, connect_timeout=1.0)
        await consumer.start()
        try:
            async with Producer(nsqd=[healthy]) as p:
                for i in range(5):
                    await p.publish("garbled", b"m%d" % i)
            await watch.until(lambda: len(got) == 5, WAIT, "5 messages from the healthy node")
            await wait_until(lambda: web.connections >= 2, WAIT)  # the web server is retried
            assert not consumer.closed
        finally:
            await consumer.close()
        await consumer.join()  # ended by close(), not by the web server's answer
