"""Connection cases the dev cluster cannot produce on demand, against a tiny raw asyncio server.

Each server here is a few lines of asyncio streams written for one test, used ONLY because
the dev cluster (a faithful nsqd) cannot be made to do it deterministically:

* put the IDENTIFY answer and the first compressed bytes in one TCP segment (a real nsqd
  usually does, but not reliably): the server replays the exact bytes the real classic nsqd
  sent in the tcp_19 (snappy) and tcp_20 (deflate) captures, in a single write;
* send a corrupt frame;
* stop reading, so the client's transport crosses its high-water mark (back-pressure).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from support import WAIT

from smartnsq.config import ConnectionConfig
from smartnsq.errors import ConnectionClosed, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.compression import Compression, DeflateStream, SnappyStream
from smartnsq.protocol.frames import encode_response
from smartnsq.transport.connection import Connection

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "classic"
_HEX = re.compile(r"^(?:##)?\s+[0-9a-f]{4}  ((?:[0-9a-f]{2} )+)")

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def received_by_client(name: str) -> list[bytes]:
    """Every ``<< RECV`` dump of a capture: the bytes the real server wrote, in order."""
    out: list[tuple[str, bytearray]] = []
    for line in (FIXTURES / name).read_text().splitlines():
        m = _HEX.match(line + " ")
        if m:
            out[-1][1].extend(bytes.fromhex(m.group(1)))
        else:
            out.append((line, bytearray()))
    return [bytes(data) for header, data in out if header.startswith("<< RECV") and data]


async def read_identify(reader: asyncio.StreamReader) -> bytes:
    assert await reader.readexactly(4) == commands.MAGIC_V2
    assert await reader.readline() == b"IDENTIFY\n"
    size = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(size)


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._server: asyncio.Server | None = None
        self.done: asyncio.Future[None] | None = None

    async def __aenter__(self) -> RawServer:
        self.done = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            assert self.done is not None
            try:
                await self._handler(reader, writer)
            except BaseException as exc:
                if not self.done.done():
                    self.done.set_exception(exc)
                raise
            else:
                if not self.done.done():
                    self.done.set_result(None)
            finally:
                writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])


@pytest.mark.parametrize(("capture", "compression", "stream"), [
    ("tcp_19_identify_snappy.txt", "snappy", SnappyStream),
    ("tcp_20_identify_deflate.txt", "deflate", lambda: DeflateStream(6)),
])
async def test_upgrade_bytes_in_the_same_read_as_the_identify_answer(
        capture: str, compression: Compression,
        stream: Callable[[], SnappyStream | DeflateStream]) -> None:
    recorded = received_by_client(capture)
    # [IDENTIFY answer, compressed OK, compressed OK for PUB, ...] as the real nsqd sent them
    identify_answer, upgrade_ok, pub_ok = recorded[0], recorded[1], recorded[2]
    client_bytes: list[bytes] = []

    async def nsqd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(identify_answer + upgrade_ok)  # one write: one segment on loopback
        inflate = stream()
        plain = b""
        while b"PUB" not in plain or not plain.endswith(b"payload"):
            chunk = await reader.read(65536)
            assert chunk
            plain += inflate.decompress(chunk)
        client_bytes.append(plain)
        writer.write(pub_ok)
        await writer.drain()
        await reader.read()  # until the client closes

    async with RawServer(nsqd) as server:
        conn = await Connection.connect("127.0.0.1", server.port,
                                        ConnectionConfig(compression=compression))
        assert conn.compression == compression and not conn.is_youzan
        assert await conn.request(commands.pub("cl_t", b"payload"), "PUB") == b"OK"
        await conn.close()
        assert server.done is not None
        await asyncio.wait_for(server.done, WAIT)
    assert client_bytes == [commands.pub("cl_t", b"payload")]


async def test_corrupt_frame_closes_and_fails_pending_calls() -> None:
    async def nsqd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_identify(reader)
        writer.write(encode_response(b'{"version":"1.3.0"}'))
        await reader.readline()  # the PUB line
        writer.write(b"\xff\xff\xff\xf0\x00\x00\x00\x00")  # frame size -16
        await reader.read()

    async with RawServer(nsqd) as server:
        conn = await Connection.connect("127.0.0.1", server.port)
        with pytest.raises(ConnectionClosed) as caught:
            await conn.request(commands.pub("cl_t", b"x"), "PUB")
        assert isinstance(caught.value.__cause__, ProtocolError)
        reason = await asyncio.wait_for(conn.closed, WAIT)
        assert isinstance(reason, ProtocolError)
        await conn.close()


async def test_back_pressure_makes_drain_wait() -> None:
    resume_reading = asyncio.Event()
    total = 0

    async def nsqd(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal total
        await read_identify(reader)
        writer.write(encode_response(b'{"version":"1.3.0"}'))
        await resume_reading.wait()  # meanwhile socket buffers fill up
        while chunk := await reader.read(1 << 20):
            total += len(chunk)

    chunk = commands.pub("cl_t", b"x" * (1 << 20))
    async with RawServer(nsqd) as server:
        conn = await Connection.connect("127.0.0.1", server.port)
        sent = 0
        assert len(chunk) >= conn.config.flush_threshold  # so send() writes it at once
        while not conn.writing_paused:
            assert sent < 512, "the transport never reported back-pressure"
            conn.send(chunk)
            sent += 1
        drain_entered = asyncio.Event()

        async def drain() -> None:
            drain_entered.set()
            await conn.drain()  # runs up to its wait in the same step as the set() above

        draining = asyncio.ensure_future(drain())
        await drain_entered.wait()
        assert conn.writing_paused and not draining.done()  # drain() is blocked, not unstarted
        resume_reading.set()
        await asyncio.wait_for(draining, WAIT)
        assert not conn.writing_paused
        await conn.close()
        assert server.done is not None
        await asyncio.wait_for(server.done, WAIT)
    assert total >= sent * len(chunk)
