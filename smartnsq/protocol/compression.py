"""The stream transforms IDENTIFY can switch on: snappy framing and raw deflate (protocol.md 3.3).

Both sit *below* the NSQ framing and cover the whole connection in both directions from the
upgrade on: the connection compresses every write and decompresses every read before the
``FrameReader`` sees it. The captures fix the formats (classic ``tcp_19``, ``tcp_20``):

* snappy is the *framing* format: a stream identifier chunk (``ff 06 00 00 sNaPpY``), then
  compressed (``0x00``) or uncompressed (``0x01``) chunks, each with a masked CRC-32C;
* deflate is raw RFC 1951 (no zlib header, ``wbits=-15``), every write ending in a sync flush
  (``00 00 ff ff``) so the peer can decode it without waiting for more.

Each object keeps one state per direction: ``compress`` is the outbound stream, ``decompress``
the inbound one. Either accepts any split of its stream; a chunk cut in two yields its bytes
once the rest arrives.

``split_first_frame`` serves the upgrade itself: the frame that acknowledges an upgrade is
still in the old encoding while the bytes right behind it, possibly in the same read, are
already in the new one, so the connection must cut the stream exactly there.
"""

from __future__ import annotations

import zlib
from typing import Final, Literal, Protocol

import snappy

from ..errors import InvalidArgument, ProtocolError

__all__ = [
    "COMPRESSIONS",
    "Compression",
    "DeflateStream",
    "SnappyStream",
    "StreamTransform",
    "split_first_frame",
    "stream_for",
]

Compression = Literal["none", "snappy", "deflate"]
COMPRESSIONS: Final[tuple[Compression, ...]] = ("none", "snappy", "deflate")

SNAPPY_STREAM_IDENTIFIER: Final = b"\xff\x06\x00\x00sNaPpY"
DEFLATE_SYNC_MARKER: Final = b"\x00\x00\xff\xff"


class StreamTransform(Protocol):
    """What the connection needs from a transform: one call per write and per read."""

    def compress(self, data: bytes) -> bytes: ...

    def decompress(self, data: bytes) -> bytes: ...


class SnappyStream:
    """Snappy framing format in both directions (python-snappy, backed by cramjam).

    The first ``compress`` output starts with the stream identifier; payloads above 64 KiB are
    split into several chunks, as the format requires. A bad checksum or a corrupt chunk
    raises ``ProtocolError``.
    """

    __slots__ = ("_in", "_out")

    def __init__(self) -> None:
        self._out = snappy.StreamCompressor()
        self._in = snappy.StreamDecompressor()

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        return bytes(self._out.add_chunk(data))

    def decompress(self, data: bytes) -> bytes:
        if not data:
            return b""
        try:
            return bytes(self._in.decompress(data))
        except Exception as exc:  # cramjam reports corruption as OSError/ValueError
            raise ProtocolError(f"snappy stream corrupt: {exc}") from exc


class DeflateStream:
    """Raw deflate (RFC 1951) in both directions; each ``compress`` ends in a sync flush.

    ``level`` is 1..9: youzan nsqd takes the level as sent and 0 would mean no compression
    (protocol.md 3.3), so the level is always explicit.
    """

    __slots__ = ("_in", "_out", "level")

    def __init__(self, level: int = 6) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 9:
            raise InvalidArgument("deflate_level", "must be an int in 1..9", level)
        self.level = level
        self._out = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._in = zlib.decompressobj(-15)

    def compress(self, data: bytes) -> bytes:
        if not data:
            return b""
        out = self._out
        return out.compress(data) + out.flush(zlib.Z_SYNC_FLUSH)

    def decompress(self, data: bytes) -> bytes:
        if not data:
            return b""
        try:
            return self._in.decompress(data)
        except zlib.error as exc:
            raise ProtocolError(f"deflate stream corrupt: {exc}") from exc


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
    size = int.from_bytes(data[:4], "big", signed=True)
    if size < 4:
        raise ProtocolError(f"frame size {size} below 4 during the handshake")
    end = 4 + size
    return end if len(data) >= end else 0
