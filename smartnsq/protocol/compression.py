"""The transforms IDENTIFY can switch on: snappy framing and raw deflate (docs/protocol.md §3.3).

Both sit *below* the NSQ framing and cover the whole connection in both directions from the
upgrade on: the connection compresses every write and decompresses every read before the
``FrameReader`` sees it. The captures fix the formats (classic ``tcp_19``, ``tcp_20``):

* snappy is the *framing* format: a stream identifier chunk (``ff 06 00 00 sNaPpY``), then
  compressed (``0x00``) or uncompressed (``0x01``) chunks, each with a masked CRC-32C;
* deflate is raw RFC 1951 (no zlib header, ``wbits=-15``), every write ending in a sync flush
  (``00 00 ff ff``) so the peer can decode it without waiting for more.

Each object keeps one state per direction: ``compress`` is the outbound stream, ``decompress``
the inbound one. Either accepts any split of its stream; a chunk cut in two yields its bytes
once the rest arrives. The same classes serve the client connection and the dev cluster's
nsqd (``smartnsq.devcluster.nsqd.tcp``), so both ends chunk and flush alike: snappy cuts
writes into chunks of at most 64 KiB uncompressed, deflate ends every non-empty write in a
sync flush, and an empty write produces no bytes at all.

Inflating is bounded. A peer can make a small input inflate enormously (deflate reaches about
1000:1: 256 KiB read from the socket become 256 MiB), so ``decompress(data, max_length)``
returns at most ``max_length`` bytes and keeps the rest of the input; while ``more`` is true,
``decompress(b"", max_length)`` gives the next piece. The connection feeds each piece to the
``FrameReader`` before inflating the next, so memory stays within the frame limit plus one
piece, and a stream that cannot be framed fails at its first bad frame, not after inflating
everything. Snappy chunks are checked before they are decoded: one declaring more than 64 KiB
of output, or longer than a 64 KiB chunk can compress to, is a ``ProtocolError``.

``split_first_frame`` serves the upgrade itself: the frame that acknowledges an upgrade is
still in the old encoding while the bytes right behind it, possibly in the same read, are
already in the new one, so the connection must cut the stream exactly there.
"""

from __future__ import annotations

import zlib
from struct import Struct
from typing import Any, Final, Literal, Protocol

from ..errors import InvalidArgument, ProtocolError
from .diagnose import describe_start, looks_like_http, nsqd_hint_for_http
from .numbers import check_int, is_int

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "DeflateStream",
    "SnappyStream",
    "StreamTransform",
    "snappy_module",
    "snappy_preamble",
    "split_first_frame",
    "stream_for",
]

Compression = Literal["none", "snappy", "deflate"]
COMPRESSIONS: Final[tuple[Compression, ...]] = ("none", "snappy", "deflate")

SNAPPY_STREAM_IDENTIFIER: Final = b"\xff\x06\x00\x00sNaPpY"
DEFLATE_SYNC_MARKER: Final = b"\x00\x00\xff\xff"


SNAPPY_MAX_BLOCK: Final = 65536
"""Most uncompressed bytes one snappy framing chunk may carry (the format's rule)."""
_SNAPPY_MAX_CHUNK: Final = 4 + 32 + SNAPPY_MAX_BLOCK + SNAPPY_MAX_BLOCK // 6  # CRC + worst case
_CHUNK_HEADER: Final = Struct("<I")  # type byte, then a 24-bit little-endian length


class StreamTransform(Protocol):
    """What a connection needs from a transform: one call per write and per read."""

    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes, max_length: int = 0) -> bytes: ...

    @property
    def more(self) -> bool: ...


def snappy_module() -> Any:
    """python-snappy, imported when snappy is first needed: with cramjam it is 1.75 MiB
    a process that never compresses should not carry (docs/performance.md)."""
    try:
        import snappy
    except ImportError as exc:  # a broken or partial install: say what is missing
        raise ProtocolError("snappy compression needs the python-snappy package "
                            f"(pip install python-snappy): {exc}") from exc
    return snappy


class SnappyStream:
    """Snappy framing format in both directions (python-snappy, backed by cramjam).

    The first ``compress`` output starts with the stream identifier; payloads above 64 KiB are
    split into several chunks, as the format requires. Inbound chunks are framed here (type,
    length, declared size) and handed to the decoder only when whole and within the format's
    bounds; a bad checksum, a corrupt or oversized chunk, or a reserved chunk type raises
    ``ProtocolError``.
    """

    __slots__ = ("_buf", "_in", "_out")

    def __init__(self) -> None:
        snappy = snappy_module()
        self._out = snappy.StreamCompressor()
        self._in = snappy.StreamDecompressor()
        self._buf = bytearray()

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        return bytes(self._out.add_chunk(data))  # chunks of at most 64 KiB uncompressed

    @property
    def more(self) -> bool:
        """A whole chunk is waiting: ``decompress(b"", n)`` has output."""
        buf = self._buf
        return len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[1:4], "little")

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        produced = 0
        header = _CHUNK_HEADER.unpack_from
        while n - pos >= 4:
            word = header(buf, pos)[0]
            kind = word & 0xFF
            length = word >> 8
            if length > _SNAPPY_MAX_CHUNK:
                raise ProtocolError(f"snappy chunk of {length} bytes is over the "
                                    f"{_SNAPPY_MAX_CHUNK} a 64 KiB block can take")
            end = pos + 4 + length
            if end > n:
                break
            if kind == 0x00:
                # the block's varint preamble: one or two bytes inline (up to 16 KiB),
                # longer ones checked against the 64 KiB block limit
                first = buf[pos + 8] if length > 4 else 0
                if first < 0x80:
                    produced += first
                elif length > 5 and buf[pos + 9] < 0x80:
                    produced += (first & 0x7F) | buf[pos + 9] << 7
                else:
                    declared = snappy_preamble(buf, pos + 8, end)
                    if declared > SNAPPY_MAX_BLOCK:
                        raise ProtocolError(f"snappy chunk declares {declared} bytes, over "
                                            f"the {SNAPPY_MAX_BLOCK} of the framing format")
                    produced += declared
            elif kind == 0x01:
                produced += length - 4
            elif 0x02 <= kind <= 0x7F:
                raise ProtocolError(f"snappy chunk type {kind:#04x} is reserved")
            pos = end
            if max_length and produced >= max_length:
                break
        if not pos:
            return b""
        chunks = bytes(buf[:pos])
        del buf[:pos]
        try:
            return bytes(self._in.decompress(chunks))
        except Exception as exc:  # cramjam reports corruption as OSError/ValueError
            raise ProtocolError(f"snappy stream corrupt: {exc}") from exc


def snappy_preamble(buf: bytes | bytearray, start: int, end: int) -> int:
    """The uncompressed size a snappy block declares (its varint preamble), read before the
    block is decoded so that a caller can refuse it unmade."""
    size = 0
    shift = 0
    for i in range(start, min(end, start + 5)):
        byte = buf[i]
        size |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return size
        shift += 7
    raise ProtocolError("snappy block without a valid length preamble")


class DeflateStream:
    """Raw deflate (RFC 1951) in both directions; each ``compress`` ends in a sync flush.

    ``level`` is 1..9: youzan nsqd takes the level as sent and 0 would mean no compression
    (docs/protocol.md §3.3), so the level is always explicit. :meth:`go_level` builds the stream a
    Go nsqd uses for the level it settled on (the dev cluster's side).
    """

    __slots__ = ("_in", "_more", "_out", "_tail", "level")

    def __init__(self, level: int = 6) -> None:
        check_int("deflate_level", level, 1, 9)
        self._setup(level, zlib.Z_DEFAULT_STRATEGY)

    def _setup(self, level: int, strategy: int) -> None:
        self.level = level
        self._out = zlib.compressobj(level, zlib.DEFLATED, -15, strategy=strategy)
        self._in = zlib.decompressobj(-15)
        self._tail = b""
        self._more = False

    @classmethod
    def go_level(cls, level: int) -> DeflateStream:
        """The stream at a Go flate level: -2 Huffman only, -1 default (6), 0 stored, 1..9.

        Outside -2..9 raises ``ValueError`` with Go's own text (nsqd fails the upgrade
        with it).
        """
        if not is_int(level) or not GO_MIN_FLATE_LEVEL <= level <= GO_MAX_FLATE_LEVEL:
            raise ValueError(f"flate: invalid compression level {level}: want value in range "
                             f"[{GO_MIN_FLATE_LEVEL}, {GO_MAX_FLATE_LEVEL}]")
        stream = cls.__new__(cls)
        if level == -2:
            stream._setup(6, zlib.Z_HUFFMAN_ONLY)
        else:
            stream._setup(6 if level == -1 else level, zlib.Z_DEFAULT_STRATEGY)
        return stream

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        out = self._out
        return out.compress(data) + out.flush(zlib.Z_SYNC_FLUSH)

    @property
    def more(self) -> bool:
        """Output is waiting: ``decompress(b"", n)`` has more."""
        return self._more

    def decompress(self, data: bytes, max_length: int = 0) -> bytes:
        if self._tail:
            data = self._tail + data
        elif not data and not self._more:
            return b""
        try:
            out = self._in.decompress(data, max_length)
        except zlib.error as exc:
            raise ProtocolError(f"deflate stream corrupt: {exc}") from exc
        self._tail = self._in.unconsumed_tail
        self._more = bool(self._tail) or (max_length > 0 and len(out) >= max_length)
        return out


GO_MIN_FLATE_LEVEL: Final = -2
GO_MAX_FLATE_LEVEL: Final = 9


def stream_for(compression: Compression, deflate_level: int = 6) -> StreamTransform | None:
    """The transform for a negotiated compression (``None`` for ``"none"``)."""
    if compression == "snappy":
        return SnappyStream()
    if compression == "deflate":
        return DeflateStream(deflate_level)
    if compression == "none":
        return None
    raise InvalidArgument("compression", "must be 'none', 'snappy' or 'deflate'", compression)


def split_first_frame(data: bytes | bytearray) -> int:
    """Length of the first complete frame in ``data`` (size prefix included), or 0 if none.

    Only for the handshake, where the stream changes encoding right after a frame; the normal
    read path feeds whole chunks to ``FrameReader``, which checks sizes itself. A size below 4
    raises ``ProtocolError`` rather than looping on a stream that cannot be framed.
    """
    if len(data) < 4:
        return 0
    if looks_like_http(data[:5]):  # a web server (or nsqd's HTTP port) on this address
        raise ProtocolError(nsqd_hint_for_http(data[:256]))
    size = int.from_bytes(data[:4], "big", signed=True)
    if size < 4:
        raise ProtocolError(f"frame size {size} below 4 during the handshake: the stream "
                            f"starts with {describe_start(data[:256])}")
    end = 4 + size
    return end if len(data) >= end else 0
