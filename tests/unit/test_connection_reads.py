"""A connection reads the same stream whichever way asyncio hands it the bytes.

``Connection.buffer_updated`` (asyncio's buffered protocol, the default path) repeats the plain
case of ``Connection.data_received`` to save a call per read. These tests feed both the same
bytes, cut at every kind of boundary, and hold the copy to the original: the same frames
delivered in the same order, the same receive time, the same bytes held back while the
connection is not ready to read them.
"""

from __future__ import annotations

import asyncio

import pytest

from smartnsq.protocol.frames import encode_message
from smartnsq.transport.connection import Connection


def _stream(count: int) -> bytes:
    return b"".join(encode_message(1_700_000_000_000_000_000 + i, 1, b"%016d" % i,
                                   b"body-%d" % i * (i % 5 + 1)) for i in range(count))


def _cuts(data: bytes, step: int) -> list[bytes]:
    return [data[i:i + step] for i in range(0, len(data), step)]


def _connection(got: list[tuple[bytes, bytes]]) -> Connection:
    conn = Connection("127.0.0.1", 4150)
    conn.on_message = lambda frame: got.append((frame.id, frame.body))
    return conn


def _buffered(conn: Connection, chunk: bytes) -> None:
    view = conn.get_buffer(len(chunk))
    view[:len(chunk)] = chunk
    conn.buffer_updated(len(chunk))


@pytest.mark.parametrize("step", [1, 7, 26, 30, 64, 1000, 1 << 16])
async def test_buffer_updated_delivers_what_data_received_delivers(step: int) -> None:
    data = _stream(40)
    by_copy: list[tuple[bytes, bytes]] = []
    by_original: list[tuple[bytes, bytes]] = []
    copy, original = _connection(by_copy), _connection(by_original)
    for chunk in _cuts(data, step):
        _buffered(copy, chunk)
        original.data_received(chunk)
    assert by_copy == by_original
    assert len(by_copy) == 40 and by_copy[0] == (b"%016d" % 0, b"body-0")
    assert copy.last_receive > 0 and original.last_receive > 0


async def test_both_paths_hold_back_the_same_bytes_while_the_reader_waits() -> None:
    data = _stream(5)
    copy, original = _connection([]), _connection([])
    copy._held = bytearray()
    original._held = bytearray()
    for chunk in _cuts(data, 9):
        _buffered(copy, chunk)
        original.data_received(chunk)
    assert copy._held == original._held == data


async def test_the_receive_time_is_the_loops_clock_at_the_read() -> None:
    conn = _connection([])
    loop = asyncio.get_running_loop()
    before = loop.time()
    _buffered(conn, _stream(1))
    assert before <= conn.last_receive <= loop.time()
