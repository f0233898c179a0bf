"""IDENTIFY upgrades over real sockets: snappy, deflate and TLS (a throwaway trustme CA)."""

from __future__ import annotations

import json
import ssl
import struct
import sys
import zlib
from collections.abc import Iterator

import pytest
import snappy
import trustme
from nsqd_helpers import IDENTIFY, RawClient, error_then_close, running

from smartnsq.protocol import commands
from smartnsq.protocol.frames import Response

needs_start_tls = pytest.mark.skipif(sys.version_info < (3, 11),
                                     reason="asyncio.StreamWriter.start_tls is 3.11+")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def contexts(ca: trustme.CA) -> Iterator[tuple[ssl.SSLContext, ssl.SSLContext]]:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    yield server, client


async def _negotiate(client: RawClient, **fields: object) -> dict[str, object]:
    client.send(commands.identify({**IDENTIFY, **fields}))
    answer = await client.exact_frame()
    assert isinstance(answer, Response), answer
    data: dict[str, object] = json.loads(answer.data)
    return data


@pytest.mark.parametrize("classic", [False, True])
async def test_snappy_both_ways(classic: bool) -> None:
    async with running(1, classic=classic) as nodes:
        node = nodes.nodes[0]
        client = await nodes.raw(node)
        client.expect(youzan=not classic)
        assert (await _negotiate(client, snappy=True))["snappy"] is True
        # the extra OK is the first thing in the snappy stream: identifier + uncompressed chunk
        raw = await client.reader.readexactly(28)
        assert raw.hex() == "ff060000734e61507059010e000026982bcf000000060000000" + "04f4b"
        client.use_snappy()
        if not classic:
            nodes.topic("cl_snappy", channels=["ch1"])
        body = b"hello " * 20
        assert await client.call(commands.pub("cl_snappy", body, None if classic else 0)) == \
            Response(b"OK")
        assert await client.call(commands.sub("cl_snappy", "ch1" if not classic else "ch2",
                                              None if classic else 0)) == Response(b"OK")
        await client.call(commands.pub("cl_snappy", body, None if classic else 0))
        client.send(commands.rdy(1))
        msg = await client.message()
        assert msg.body == body
        client.send(commands.fin(msg.id))


@pytest.mark.parametrize("classic", [False, True])
async def test_deflate_both_ways(classic: bool) -> None:
    async with running(1, classic=classic) as nodes:
        client = await nodes.raw(nodes.nodes[0])
        client.expect(youzan=not classic)
        answer = await _negotiate(client, deflate=True, deflate_level=9)
        assert answer["deflate"] is True and answer["deflate_level"] == 6  # capped at max
        inflate = zlib.decompressobj(-15)
        plain = b""
        while len(plain) < 10:  # the deflated OK, however the compressor cut it
            raw = await client.reader.read(65536)
            assert raw, "closed"
            plain += inflate.decompress(raw)
        assert raw.endswith(b"\x00\x00\xff\xff")  # every server write is sync-flushed
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
        client._inflate = inflate  # the rest of the same stream
        client._deflate = zlib.compressobj(6, zlib.DEFLATED, -15)
        if not classic:
            nodes.topic("t", channels=["c"])
        assert await client.call(commands.pub("t", b"hello " * 20, None if classic else 0)) == \
            Response(b"OK")


async def test_youzan_deflate_level_quirk_and_classic_fallback() -> None:
    async with running(1) as yz:
        client = await yz.raw(yz.nodes[0])
        assert (await _negotiate(client, deflate=True))["deflate_level"] == 0
    async with running(1, classic=True) as cl:
        client = await cl.raw(cl.nodes[0])
        assert (await _negotiate(client, deflate=True))["deflate_level"] == 6
        client = await cl.raw(cl.nodes[0])
        body = json.dumps({"feature_negotiation": True, "snappy": True, "deflate": True}).encode()
        assert await error_then_close(client, b"IDENTIFY\n" + struct.pack(">i", len(body)) +
                                      body) == \
            b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression"


async def test_youzan_deflate_level_out_of_flate_range_fails_the_upgrade() -> None:
    async with running(1) as yz:
        client = await yz.raw(yz.nodes[0])
        answer = await _negotiate(client, deflate=True, deflate_level=-3)
        assert answer["deflate_level"] == -3
        assert await error_then_close(client, b"") == (
            b"E_IDENTIFY_FAILED IDENTIFY failed flate: invalid compression level -3: want value "
            b"in range [-2, 9]")


@needs_start_tls
@pytest.mark.parametrize("classic", [False, True])
async def test_tls_upgrade(contexts: tuple[ssl.SSLContext, ssl.SSLContext],
                           classic: bool) -> None:
    server, client_ctx = contexts
    async with running(1, classic=classic, tls=server) as nodes:
        client = await nodes.raw(nodes.nodes[0])
        assert (await _negotiate(client, tls_v1=True))["tls_v1"] is True
        await client.start_tls(client_ctx)
        assert await client.frame() == Response(b"OK")
        if not classic:
            nodes.topic("cl_topic")
        assert await client.call(commands.pub("cl_topic", b"over-tls", None if classic else 0)
                                 ) == Response(b"OK")


@needs_start_tls
async def test_tls_then_snappy(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, client_ctx = contexts
    async with running(1, tls=server) as nodes:
        nodes.topic("t")
        client = await nodes.raw(nodes.nodes[0])
        answer = await _negotiate(client, tls_v1=True, snappy=True)
        assert answer["tls_v1"] is True and answer["snappy"] is True
        await client.start_tls(client_ctx)
        assert await client.exact_frame() == Response(b"OK")  # after TLS, before snappy
        client.use_snappy()
        assert await client.frame() == Response(b"OK")  # the snappy one
        assert await client.call(commands.pub("t", b"x", 0)) == Response(b"OK")


async def test_tls_requested_but_not_configured_means_no_upgrade() -> None:
    async with running(1, classic=True) as cl:
        client = await cl.raw(cl.nodes[0])
        assert (await _negotiate(client, tls_v1=True))["tls_v1"] is False
        assert await client.call(commands.pub("t", b"plain")) == Response(b"OK")


async def test_tls_required_refuses_everything_but_identify(
        contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server, _ = contexts
    async with running(1, tls=server, tls_required=True) as nodes:
        client = await nodes.raw(nodes.nodes[0])
        await _negotiate(client)
        assert await error_then_close(client, commands.pub("t", b"x", 0)) == \
            b"E_INVALID cannot PUB in current state (TLS required)"


def test_snappy_module_frames_like_go() -> None:
    # the OK frame python-snappy produces is byte for byte the capture's (tcp_19)
    out = snappy.StreamCompressor().add_chunk(b"\x00\x00\x00\x06\x00\x00\x00\x00OK")
    assert out.hex() == "ff060000734e61507059010e000026982bcf0000000600000000" + "4f4b"
