"""Issue 21 item 5: a handshake whose last answer arrives in the same write as a fatal or
corrupt frame, and a node whose protocol error once must cost only that node (retried)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from support import bounded

from smartnsq.connection import Connection
from smartnsq.devcluster.hostile import _IDENTIFY_ANSWER, _Nsqd, frame
from smartnsq.errors import NSQError, ProtocolError, ServerError
from smartnsq.producer import Producer


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


@pytest.mark.parametrize("trailer", [FATAL, CORRUPT], ids=["fatal", "corrupt"])
async def test_a_publish_to_such_a_node_ends_within_its_timeout(trailer: bytes) -> None:
    async with IdentifyThenFatalNsqd(trailer) as peer:
        async with Producer(nsqd=[peer.address]) as p:
            with pytest.raises(NSQError):
                async with bounded(1.0):
                    await p.publish("t", b"x", timeout=1.0)
