"""The byte-stream transforms IDENTIFY can switch on: snappy framing and raw deflate.

Both apply to the whole connection in both directions, below the NSQ framing: the server
compresses everything it writes after the upgrade (starting with the extra ``OK``), and
decompresses everything it reads. Snappy is the framing format (stream identifier, then
compressed/uncompressed chunks with masked CRC32C), deflate is raw RFC 1951 with a sync flush
after every write (``00 00 ff ff``), as the captures show (``tcp_19``, ``tcp_20``).
"""

from __future__ import annotations

import zlib
from typing import Protocol

import snappy

__all__ = ["DeflateStream", "SnappyStream", "Stream", "deflate_stream"]

# Go's flate levels: -2 Huffman only, -1 default, 0 store, 1..9
MIN_FLATE_LEVEL = -2
MAX_FLATE_LEVEL = 9
_SNAPPY_MAX_CHUNK = 65536  # uncompressed bytes per framing-format chunk


class Stream(Protocol):
    def encode(self, data: bytes) -> bytes: ...

    def decode(self, data: bytes) -> bytes: ...


class SnappyStream:
    def __init__(self) -> None:
        self._out = snappy.StreamCompressor()
        self._in = snappy.StreamDecompressor()

    def encode(self, data: bytes) -> bytes:
        if len(data) <= _SNAPPY_MAX_CHUNK:
            return bytes(self._out.add_chunk(data))
        return b"".join(bytes(self._out.add_chunk(data[i:i + _SNAPPY_MAX_CHUNK]))
                        for i in range(0, len(data), _SNAPPY_MAX_CHUNK))

    def decode(self, data: bytes) -> bytes:
        return bytes(self._in.decompress(data))


class DeflateStream:
    def __init__(self, level: int) -> None:
        if level == -2:
            self._out = zlib.compressobj(6, zlib.DEFLATED, -15, strategy=zlib.Z_HUFFMAN_ONLY)
        else:
            self._out = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._in = zlib.decompressobj(-15)

    def encode(self, data: bytes) -> bytes:
        return self._out.compress(data) + self._out.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> bytes:
        return self._in.decompress(data)


def deflate_stream(level: int) -> DeflateStream:
    """A deflate stream at a Go flate level; ``ValueError`` with Go's text when invalid."""
    if not MIN_FLATE_LEVEL <= level <= MAX_FLATE_LEVEL:
        raise ValueError(f"flate: invalid compression level {level}: "
                         f"want value in range [{MIN_FLATE_LEVEL}, {MAX_FLATE_LEVEL}]")
    return DeflateStream(level)
