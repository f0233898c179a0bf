"""Snappy and deflate stream transforms against the bytes real nsqd put on the wire.

The classic captures tcp_19 (snappy) and tcp_20 (deflate) hold both directions of a compressed
connection; decoding them with our transforms, at every split point, is the main check. The
snappy framing format is also checked with a small independent reader written here (chunk
types, lengths, masked CRC-32C), so our compressor is not only tested against itself.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import pytest
import snappy
from hypothesis import given, settings
from hypothesis import strategies as st

from smartnsq.errors import InvalidArgument, ProtocolError
from smartnsq.protocol.compression import (
    DEFLATE_SYNC_MARKER,
    SNAPPY_STREAM_IDENTIFIER,
    DeflateStream,
    SnappyStream,
    split_first_frame,
    stream_for,
)
from smartnsq.protocol.frames import CLASSIC_LAYOUT, FrameReader, MessageFrame, Response

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "classic"
_HEX = re.compile(r"^(?:##)?\s+[0-9a-f]{4}  ((?:[0-9a-f]{2} )+)")


def blocks(name: str) -> list[tuple[str, bytes]]:
    """(header line, bytes of the hex dump under it) for every dump in a capture."""
    out: list[tuple[str, bytearray]] = []
    for line in (FIXTURES / name).read_text().splitlines():
        m = _HEX.match(line + " ")
        if m:
            out[-1][1].extend(bytes.fromhex(m.group(1)))
        else:
            out.append((line, bytearray()))
    return [(h, bytes(b)) for h, b in out if b]


def select(name: str, pattern: str) -> list[bytes]:
    return [data for header, data in blocks(name) if re.search(pattern, header)]


def sent_pairs(name: str, marker: str) -> list[tuple[bytes, bytes]]:
    """(plaintext, bytes on the wire) of every compressed client write."""
    pairs = []
    plain: bytes | None = None
    for header, data in blocks(name):
        if header.startswith("## plaintext"):
            plain = data
        elif header.startswith(">> SEND") and marker in header:
            assert plain is not None
            pairs.append((plain, data))
            plain = None
    return pairs


# -- an independent reader of the snappy framing format -----------------------------------

def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_snappy_frames(stream: bytes) -> tuple[bytes, list[int]]:
    """Decode a framing-format stream by the spec; returns the data and the chunk types."""
    assert stream.startswith(SNAPPY_STREAM_IDENTIFIER)
    out, kinds, pos = bytearray(), [], 0
    while pos < len(stream):
        kind = stream[pos]
        length = int.from_bytes(stream[pos + 1:pos + 4], "little")
        body = stream[pos + 4:pos + 4 + length]
        assert len(body) == length
        kinds.append(kind)
        if kind in (0x00, 0x01):
            crc = int.from_bytes(body[:4], "little")
            data = snappy.uncompress(body[4:]) if kind == 0x00 else body[4:]
            assert len(data) <= 65536
            assert masked_crc32c(data) == crc
            out += data
        else:
            assert kind == 0xFF and body == b"sNaPpY"
        pos += 4 + length
    return bytes(out), kinds


# -- snappy, tcp_19 ------------------------------------------------------------------------

SNAPPY = "tcp_19_identify_snappy.txt"


def test_reference_reader_agrees_with_the_capture() -> None:
    received = b"".join(select(SNAPPY, r"^<< RECV .*snappy-framed"))
    decoded = b"".join(select(SNAPPY, r"^## decoded"))
    data, kinds = read_snappy_frames(received)
    assert data == decoded
    assert kinds == [0xFF, 0x01, 0x01, 0x01, 0x00]  # the message came as a compressed chunk


def test_snappy_decodes_what_nsqd_sent_at_every_split() -> None:
    received = b"".join(select(SNAPPY, r"^<< RECV .*snappy-framed"))
    decoded = b"".join(select(SNAPPY, r"^## decoded"))
    for cut in range(len(received) + 1):
        stream = SnappyStream()
        assert stream.decompress(received[:cut]) + stream.decompress(received[cut:]) == decoded
    frames = FrameReader(CLASSIC_LAYOUT).feed(decoded)
    assert frames[:3] == [Response(b"OK")] * 3
    msg = frames[3]
    assert isinstance(msg, MessageFrame)
    assert msg.id == b"18a4422534a69000" and msg.body == b"hello " * 20 and msg.attempts == 1


def test_snappy_decodes_what_the_client_sent() -> None:
    pairs = sent_pairs(SNAPPY, "snappy-framed")
    assert len(pairs) == 4
    stream = SnappyStream()
    assert [stream.decompress(wire) for _, wire in pairs] == [plain for plain, _ in pairs]


def test_snappy_compress_writes_the_framing_format() -> None:
    pairs = sent_pairs(SNAPPY, "snappy-framed")
    stream = SnappyStream()
    wire = [stream.compress(plain) for plain, _ in pairs]
    assert wire[0].startswith(SNAPPY_STREAM_IDENTIFIER)
    assert not any(w.startswith(SNAPPY_STREAM_IDENTIFIER) for w in wire[1:])
    data, kinds = read_snappy_frames(b"".join(wire))
    assert data == b"".join(plain for plain, _ in pairs)
    assert kinds[0] == 0xFF and set(kinds[1:]) <= {0x00, 0x01}
    # small writes go out as uncompressed chunks, byte for byte what the capture's client sent
    assert wire[1:] == [w for _, w in pairs[1:]]


def test_snappy_splits_large_payloads_into_64k_chunks() -> None:
    payload = bytes(range(256)) * 1100  # 281 600 bytes, little to gain from compression
    data, kinds = read_snappy_frames(SnappyStream().compress(payload))
    assert data == payload and len(kinds) >= 6


def test_snappy_corruption_is_a_protocol_error() -> None:
    received = bytearray(b"".join(select(SNAPPY, r"^<< RECV .*snappy-framed")))
    received[-3] ^= 0x40  # inside the compressed message chunk
    with pytest.raises(ProtocolError):
        SnappyStream().decompress(bytes(received))


# -- deflate, tcp_20 -----------------------------------------------------------------------

DEFLATE = "tcp_20_identify_deflate.txt"


def test_deflate_decodes_what_nsqd_sent_at_every_split() -> None:
    chunks = select(DEFLATE, r"^<< RECV .*DEFLATE")
    assert all(c.endswith(DEFLATE_SYNC_MARKER) for c in chunks)
    received = b"".join(chunks)
    decoded = b"".join(select(DEFLATE, r"^## decoded"))
    for cut in range(len(received) + 1):
        stream = DeflateStream(6)
        assert stream.decompress(received[:cut]) + stream.decompress(received[cut:]) == decoded
    # each server write is complete on its own: nothing waits for the next one
    stream = DeflateStream(6)
    plain = [stream.decompress(c) for c in chunks]
    assert b"".join(plain) == decoded
    frames = FrameReader(CLASSIC_LAYOUT).feed(decoded)
    assert frames[:3] == [Response(b"OK")] * 3
    assert isinstance(frames[3], MessageFrame) and frames[3].body == b"hello " * 20


def test_deflate_decodes_what_the_client_sent() -> None:
    pairs = sent_pairs(DEFLATE, "DEFLATE")
    assert len(pairs) == 4
    stream = DeflateStream(6)
    assert [stream.decompress(wire) for _, wire in pairs] == [plain for plain, _ in pairs]


def test_deflate_compress_is_raw_and_sync_flushed() -> None:
    pairs = sent_pairs(DEFLATE, "DEFLATE")
    stream = DeflateStream(6)
    peer = zlib.decompressobj(-15)  # a raw inflater: a zlib header would fail here
    for plain, _ in pairs:
        wire = stream.compress(plain)
        assert wire.endswith(DEFLATE_SYNC_MARKER)
        assert peer.decompress(wire) == plain  # decodable at once, per write


@pytest.mark.skipif("ng" in zlib.ZLIB_RUNTIME_VERSION, reason="zlib-ng deflates differently")
def test_deflate_compress_matches_the_capture_byte_for_byte() -> None:
    pairs = sent_pairs(DEFLATE, "DEFLATE")
    stream = DeflateStream(6)
    assert [stream.compress(plain) for plain, _ in pairs] == [wire for _, wire in pairs]


def test_deflate_level_is_explicit() -> None:
    for bad in (0, 10, -1, True, "6"):
        with pytest.raises(InvalidArgument):
            DeflateStream(bad)  # type: ignore[arg-type]
    assert DeflateStream(1).level == 1


def test_deflate_corruption_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        DeflateStream().decompress(b"\xff\xff\xff\xff\xff")


# -- both ----------------------------------------------------------------------------------

def test_stream_for() -> None:
    assert stream_for("none") is None
    assert isinstance(stream_for("snappy"), SnappyStream)
    deflate = stream_for("deflate", 3)
    assert isinstance(deflate, DeflateStream) and deflate.level == 3
    with pytest.raises(InvalidArgument):
        stream_for("gzip")  # type: ignore[arg-type]


def test_empty_input_gives_empty_output() -> None:
    for stream in (SnappyStream(), DeflateStream()):
        assert stream.compress(b"") == b""
        assert stream.decompress(b"") == b""


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0), max_size=6),
       kind=st.sampled_from(["snappy", "deflate"]))
def test_round_trip_any_split(writes: list[bytes], cuts: list[int], kind: str) -> None:
    sender = SnappyStream() if kind == "snappy" else DeflateStream(6)
    receiver = SnappyStream() if kind == "snappy" else DeflateStream(6)
    wire = b"".join(sender.compress(w) for w in writes)
    points = sorted({c % (len(wire) + 1) for c in cuts})
    out = bytearray()
    start = 0
    for point in [*points, len(wire)]:
        out += receiver.decompress(wire[start:point])
        start = point
    assert bytes(out) == b"".join(writes)


def test_split_first_frame() -> None:
    ok = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert split_first_frame(b"") == 0
    assert split_first_frame(ok[:3]) == 0
    assert split_first_frame(ok[:9]) == 0
    assert split_first_frame(ok) == 10
    assert split_first_frame(ok + b"\xff\x06\x00\x00sNaPpY") == 10
    with pytest.raises(ProtocolError):
        split_first_frame(b"\xff\x06\x00\x00sNaPpY")


def _chunks(stream: bytes) -> list[tuple[int, int]]:
    """``(type, uncompressed size)`` of every chunk of a framing-format stream."""
    out, pos = [], 0
    while pos < len(stream):
        kind, length = stream[pos], int.from_bytes(stream[pos + 1:pos + 4], "little")
        body = stream[pos + 4:pos + 4 + length]
        sizes = {0x00: len(snappy.uncompress(body[4:])) if kind == 0x00 else 0,
                 0x01: length - 4}
        size = sizes.get(kind, 0)
        out.append((kind, size))
        pos += 4 + length
    return out


@pytest.mark.parametrize("size", [1, 65535, 65536, 65537, 200_000])
def test_snappy_chunking_both_ends_share(size: int) -> None:
    # writes are cut in whole 64 KiB chunks, then the rest, compressed or stored (the dev
    # cluster's nsqd uses this same class, so both ends cut alike)
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    client = SnappyStream().compress(payload)
    sizes = [n for kind, n in _chunks(client) if kind in (0x00, 0x01)]
    assert sizes == [65536] * (size // 65536) + ([size % 65536] if size % 65536 else [])
    assert SnappyStream().decompress(client) == payload


def test_deflate_flushes_every_write_and_skips_empty_ones() -> None:
    for stream in (DeflateStream(6), DeflateStream.go_level(6)):
        assert stream.compress(b"") == b""
        assert stream.compress(b"hello").endswith(DEFLATE_SYNC_MARKER)


@pytest.mark.parametrize("level", [-2, -1, 0, 1, 6, 9])
def test_go_flate_levels(level: int) -> None:
    sender, receiver = DeflateStream.go_level(level), DeflateStream()
    data = b"abc" * 1000
    assert receiver.decompress(sender.compress(data)) == data


@pytest.mark.parametrize("level", [-3, 10])
def test_go_flate_level_out_of_range_has_gos_text(level: int) -> None:
    with pytest.raises(ValueError, match=rf"flate: invalid compression level {level}: "
                                         r"want value in range \[-2, 9\]"):
        DeflateStream.go_level(level)


# -- bounded inflation: a small frame never inflates past the asked size in one step ----------

def _drain(stream: SnappyStream | DeflateStream, data: bytes, step: int) -> list[int]:
    sizes = [len(stream.decompress(data, step))]
    while stream.more:
        sizes.append(len(stream.decompress(b"", step)))
    return sizes


def test_deflate_bomb_inflates_in_bounded_pieces() -> None:
    bomb = DeflateStream(9).compress(bytes(64 * 1024 * 1024))
    assert len(bomb) < 128 * 1024
    sizes = _drain(DeflateStream(), bomb, 256 * 1024)
    assert max(sizes) <= 256 * 1024 and sum(sizes) == 64 * 1024 * 1024


def test_snappy_inflates_in_bounded_pieces() -> None:
    wire = SnappyStream().compress(bytes(4 * 1024 * 1024))  # 64 chunks of 64 KiB zeros
    sizes = _drain(SnappyStream(), wire, 256 * 1024)
    assert max(sizes) <= 256 * 1024 + 65536 and sum(sizes) == 4 * 1024 * 1024
    assert len(sizes) >= 16


def test_snappy_chunks_are_checked_before_decoding() -> None:
    ident = SNAPPY_STREAM_IDENTIFIER
    with pytest.raises(ProtocolError, match="over the"):
        SnappyStream().decompress(ident + b"\x00" + (1 << 20).to_bytes(3, "little"))
    preamble = b"\x80\x80\x08"  # a block declaring 131072 bytes (varint)
    body = b"\x00\x00\x00\x00" + preamble + b"\x00" * 8
    with pytest.raises(ProtocolError, match="declares 131072"):
        SnappyStream().decompress(ident + b"\x00" + len(body).to_bytes(3, "little") + body)
    with pytest.raises(ProtocolError, match="reserved"):
        SnappyStream().decompress(ident + b"\x02\x01\x00\x00x")
    # skippable chunks (0x80..0xfe) are skipped
    assert SnappyStream().decompress(ident + b"\x80\x02\x00\x00xx") == b""


@settings(max_examples=60, deadline=None)
@given(writes=st.lists(st.binary(max_size=3000), min_size=1, max_size=8),
       cuts=st.lists(st.integers(min_value=0), max_size=6),
       step=st.integers(min_value=1, max_value=5000),
       kind=st.sampled_from(["snappy", "deflate"]))
def test_bounded_round_trip_any_split(writes: list[bytes], cuts: list[int], step: int,
                                      kind: str) -> None:
    sender = SnappyStream() if kind == "snappy" else DeflateStream(6)
    receiver = SnappyStream() if kind == "snappy" else DeflateStream(6)
    wire = b"".join(sender.compress(w) for w in writes)
    points = sorted({c % (len(wire) + 1) for c in cuts})
    out = bytearray()
    start = 0
    bound = step if kind == "deflate" else step + 65536
    for point in [*points, len(wire)]:
        piece = receiver.decompress(wire[start:point], step)
        assert len(piece) <= bound
        out += piece
        while receiver.more:
            piece = receiver.decompress(b"", step)
            assert len(piece) <= bound
            out += piece
        start = point
    assert bytes(out) == b"".join(writes)
