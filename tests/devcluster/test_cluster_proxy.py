"""The TCP proxy's connection faults, seen by a raw asyncio-streams client.

The target is a line echo server, so each fault's effect on the client is the only variable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from smartnsq.devcluster.proxy import TCPProxy

TIMEOUT = 5.0


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while line := await reader.readline():
            writer.write(line)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


@pytest.fixture
async def proxy() -> AsyncIterator[TCPProxy]:
    server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    proxy = TCPProxy("127.0.0.1", port, name="test-proxy")
    await proxy.start()
    yield proxy
    await proxy.stop()
    server.close()
    await server.wait_closed()


async def connect(proxy: TCPProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    data: bytes = b"ping\n") -> bytes:
    writer.write(data)
    await writer.drain()
    return await asyncio.wait_for(reader.readline(), TIMEOUT)


async def test_forwards_both_ways(proxy: TCPProxy) -> None:
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer) == b"ping\n"
    assert await roundtrip(reader, writer, b"x" * 50000 + b"\n") == b"x" * 50000 + b"\n"
    assert proxy.connections == 1
    writer.close()


async def test_cut_closes_every_open_connection(proxy: TCPProxy) -> None:
    conns = [await connect(proxy) for _ in range(3)]
    for reader, writer in conns:
        assert await roundtrip(reader, writer) == b"ping\n"
    assert proxy.cut() == 3
    for reader, _ in conns:
        try:
            data = await asyncio.wait_for(reader.read(100), TIMEOUT)
        except ConnectionResetError:
            data = b""
        assert data == b""  # EOF or reset: the connection is gone
    for _, gone in conns:
        gone.close()
    # new connections work again
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer) == b"ping\n"
    writer.close()


async def test_stall_holds_bytes_until_resume(proxy: TCPProxy) -> None:
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer) == b"ping\n"
    proxy.stall()
    writer.write(b"held\n")
    await writer.drain()
    pending = asyncio.ensure_future(reader.readline())
    done, _ = await asyncio.wait([pending], timeout=0.2)
    assert not done and proxy.stalled  # the connection is open but silent
    proxy.resume()
    assert await asyncio.wait_for(pending, TIMEOUT) == b"held\n"
    writer.close()


async def test_delay_keeps_order(proxy: TCPProxy) -> None:
    proxy.set_delay(response=0.05)
    reader, writer = await connect(proxy)
    for i in range(5):
        writer.write(b"%d\n" % i)
    await writer.drain()
    got = [await asyncio.wait_for(reader.readline(), TIMEOUT) for _ in range(5)]
    assert got == [b"%d\n" % i for i in range(5)]
    proxy.set_delay()
    assert proxy.response_delay == 0.0
    writer.close()


async def test_refuse_then_accept_on_the_same_port(proxy: TCPProxy) -> None:
    reader, writer = await connect(proxy)
    port = proxy.port
    await proxy.refuse()
    with pytest.raises(OSError):
        await connect(proxy)
    assert await roundtrip(reader, writer) == b"ping\n"  # existing connection unaffected
    await proxy.accept()
    assert proxy.port == port
    r2, w2 = await connect(proxy)
    assert await roundtrip(r2, w2) == b"ping\n"
    writer.close()
    w2.close()


async def test_target_down_resets_the_client() -> None:
    sock_server = await asyncio.start_server(_echo, "127.0.0.1", 0)
    port = sock_server.sockets[0].getsockname()[1]
    sock_server.close()
    await sock_server.wait_closed()
    proxy = TCPProxy("127.0.0.1", port)
    await proxy.start()
    try:
        reader, writer = await connect(proxy)
        try:
            data = await asyncio.wait_for(reader.read(10), TIMEOUT)
        except ConnectionResetError:
            data = b""
        assert data == b""
        writer.close()
    finally:
        await proxy.stop()


async def test_server_close_reaches_the_client(proxy: TCPProxy) -> None:
    reader, writer = await connect(proxy)
    assert await roundtrip(reader, writer) == b"ping\n"
    writer.write_eof()  # the echo server closes when the client is done
    assert await asyncio.wait_for(reader.read(), TIMEOUT) == b""
    writer.close()
