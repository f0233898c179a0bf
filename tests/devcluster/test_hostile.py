"""The hostile peers of ``smartnsq.testing.hostile``, as a raw client sees them.

Raw asyncio streams only (no smartnsq client code on the reading side), so each test shows
exactly what any client is up against. Waits are bounded reads; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import json
import zlib

import pytest

from smartnsq.testing.hostile import (
    DeflatingNsqd,
    DripLookupd,
    FakeLookupd,
    HugeLookupd,
    LateNsqd,
    PartitionsLookupd,
    SilentLookupd,
    SilentNsqd,
    StallingNsqd,
    frame,
)

GET = b"GET /lookup?topic=t&access=w HTTP/1.1\r\nHost: x\r\n\r\n"
IDENTIFY = json.dumps({"feature_negotiation": True, "deflate": False, "snappy": False}).encode()
QUIET = 0.3  # how long "nothing arrives" is watched for


async def connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = address.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port))


async def nothing_arrives(reader: asyncio.StreamReader) -> bool:
    try:
        data = await asyncio.wait_for(reader.read(1), QUIET)
    except asyncio.TimeoutError:
        return True
    assert not data, f"{data!r} arrived"
    return False  # EOF


async def identify(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> dict[str, object]:
    writer.write(b"  V2IDENTIFY\n" + len(IDENTIFY).to_bytes(4, "big") + IDENTIFY)
    size = int.from_bytes(await asyncio.wait_for(reader.readexactly(4), 5), "big")
    data = await reader.readexactly(size)
    assert data[:4] == b"\x00\x00\x00\x00"
    return dict(json.loads(data[4:]))


async def test_fake_lookupd_answers_at_once() -> None:
    async with FakeLookupd() as lookupd:
        reader, writer = await connect(lookupd.address)
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = json.loads(await reader.readexactly(length))
        assert body["partitions"]["0"]["broadcast_address"] == "127.0.0.1"
        writer.close()


async def test_drip_lookupd_sends_one_byte_at_a_time() -> None:
    async with DripLookupd(interval=0.05) as lookupd:
        reader, writer = await connect(lookupd.address)
        writer.write(GET)
        got = b""
        for _ in range(8):  # each read gets exactly one byte: no read ever times out
            got += await asyncio.wait_for(reader.read(100), 5)
            assert len(got) == lookupd.sent
        assert got == b"HTTP/1.1"
        writer.close()


async def test_silent_lookupd_reads_and_never_answers() -> None:
    async with SilentLookupd() as lookupd:
        reader, writer = await connect(lookupd.address)
        writer.write(GET)
        assert await nothing_arrives(reader)
        assert lookupd.requests == [GET.split(b"\r\n")[0]]
        writer.close()


async def test_huge_lookupd_answer_is_hundreds_of_mib() -> None:
    async with HugeLookupd() as lookupd:
        reader, writer = await connect(lookupd.address)
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == 300 * 1024 * 1024
        read = 0
        while read < 8 * 1024 * 1024:  # streamed: it keeps coming as fast as it is read
            read += len(await asyncio.wait_for(reader.read(1 << 20), 5))
        assert lookupd.sent >= read - 1024
        writer.close()


async def test_partitions_lookupd_lists_ten_to_the_five() -> None:
    async with PartitionsLookupd() as lookupd:
        reader, writer = await connect(lookupd.address)
        writer.write(GET)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = json.loads(await asyncio.wait_for(reader.readexactly(length), 10))
        assert len(body["partitions"]) == 100_000
        assert body["meta"]["partition_num"] == 100_000
        writer.close()


async def test_silent_nsqd_never_writes() -> None:
    async with SilentNsqd() as nsqd:
        reader, writer = await connect(nsqd.address)
        writer.write(b"  V2IDENTIFY\n" + len(IDENTIFY).to_bytes(4, "big") + IDENTIFY)
        assert await nothing_arrives(reader)
        assert nsqd.connections == 1
        writer.close()


@pytest.mark.parametrize("bomb", [0, 64 * 1024 * 1024])
async def test_deflating_nsqd_turns_deflate_on_unasked(bomb: int) -> None:
    async with DeflatingNsqd(bomb=bomb) as nsqd:
        reader, writer = await connect(nsqd.address)
        answer = await identify(reader, writer)
        assert answer["deflate"] is True and nsqd.asked[0]["deflate"] is False
        inflate = zlib.decompressobj(-15)
        ok = b""
        while len(ok) < 10:
            ok += inflate.decompress(await asyncio.wait_for(reader.read(10), 5), 10 - len(ok))
        assert ok == frame(b"OK")  # the acknowledgement is already compressed
        if bomb:
            inflated, compressed, data = 0, 0, inflate.unconsumed_tail
            while True:
                while data:  # bounded pieces: the test itself must not hold 64 MiB
                    inflated += len(inflate.decompress(data, 1 << 20))
                    data = inflate.unconsumed_tail
                if inflated >= bomb:
                    break
                data = await asyncio.wait_for(reader.read(1 << 16), 5)
                compressed += len(data)
            assert inflated == bomb and compressed < bomb // 500  # ratio over 500:1
        writer.close()


async def test_stalling_nsqd_sends_half_a_frame() -> None:
    async with StallingNsqd() as nsqd:
        reader, writer = await connect(nsqd.address)
        await identify(reader, writer)
        writer.write(b"PUB t\n" + (1).to_bytes(4, "big") + b"x")
        assert await asyncio.wait_for(reader.readexactly(5), 5) == frame(b"OK")[:5]
        assert await nothing_arrives(reader)
        writer.close()


async def test_late_nsqd_answers_the_first_command_late_and_in_order() -> None:
    async with LateNsqd(delay=0.5) as nsqd:
        reader, writer = await connect(nsqd.address)
        await identify(reader, writer)
        for _ in range(2):
            writer.write(b"PUB t\n" + (1).to_bytes(4, "big") + b"x")
        assert await nothing_arrives(reader)  # 0.3 s of 0.5: the first answer is late
        assert await asyncio.wait_for(reader.readexactly(20), 5) == frame(b"OK") * 2
        writer.close()
