"""Message bodies compressed by the publishing client, as youzan/go-nsq does it (v1.6.0-HA on).

This is separate from the connection's stream compression (``compression.py``): here the
*producer* compresses one message's body before it sends PUB_EXT, and marks it in the ext JSON
header. The server stores the bytes as they came, so the consumer must undo it. go-nsq's
rules, from its ``compress.go`` and ``message.go``:

* ``"nsq.client.compress"``: the codec number as a JSON *string* (``"1"`` gzip stream, ``"2"``
  snappy block format, ``"3"`` lz4 block format, ``"0"`` not compressed). Any other JSON type
  is no mark at all, and go-nsq hands such a body over as it is. So does :func:`unpack`.
* ``"nsq.msg.size"``: the original length as a string. go-nsq uses it only as lz4's output
  buffer. Here it also bounds the output of every codec and must equal the output's length:
  a mismatch is a corrupt message, not one to hand to a handler.
* Once a body is decoded, both keys leave the header the handler sees.

Decompression is bounded (``limit``) before any output is made, so a small message cannot
become gigabytes in memory. Bytes in, values out: no sockets here.
"""

from __future__ import annotations

import json
import zlib
from typing import Any, Final, Literal

from ..errors import ProtocolError
from .compression import snappy_module, snappy_preamble

__all__ = ["CODECS", "CODEC_HEADER", "MARK", "SIZE_HEADER", "BodyCodec", "compress", "unpack"]

CODEC_HEADER: Final = "nsq.client.compress"
SIZE_HEADER: Final = "nsq.msg.size"
MARK: Final = b'"nsq.client.compress"'
"""What a cheap byte search of the raw ext header looks for before any JSON is parsed."""

BodyCodec = Literal["gzip", "snappy", "lz4"]
CODECS: Final[dict[str, int]] = {"gzip": 1, "snappy": 2, "lz4": 3}
_NAMES: Final = {number: name for name, number in CODECS.items()}
_GUESS_RATIO: Final = 10  # go-nsq's lz4 output guess when no size header came


def _lz4() -> Any:
    try:
        import lz4.block
    except ImportError as exc:
        raise ProtocolError("lz4-compressed message bodies need the lz4 package "
                            "(pip install 'smartnsq[lz4]')") from exc
    return lz4.block


def compress(codec: BodyCodec, body: bytes) -> tuple[bytes, dict[str, str]] | None:
    """``body`` compressed the way go-nsq's consumers read it, plus the two header entries.
    Returns ``None`` when compressing does not make it smaller (it is sent as it is then,
    unmarked, as go-nsq does when its codec fails)."""
    if codec == "gzip":
        out = _gzip(body)
    elif codec == "snappy":
        out = bytes(snappy_module().compress(body))
    elif codec == "lz4":
        out = bytes(_lz4().compress(body, store_size=False))
    else:
        raise ValueError(f"unknown body codec {codec!r}; known: {', '.join(CODECS)}")
    if len(out) >= len(body):
        return None
    return out, {CODEC_HEADER: str(CODECS[codec]), SIZE_HEADER: str(len(body))}


def _gzip(body: bytes) -> bytes:
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)  # wbits 16+15: the gzip container
    return packer.compress(body) + packer.flush()


def unpack(ext: bytes, body: bytes, limit: int) -> tuple[bytes, bytes] | None:
    """The original body and the ext JSON without the two keys, or ``None`` when the header
    marks nothing (no ext, no string mark). ``limit``: the most bytes a body may decompress
    to. Raises ``ProtocolError`` for a mark that cannot be honoured: an unknown codec, a bad
    size, corrupt data, output over ``limit`` or not of the declared size, or a codec whose
    package is missing."""
    if MARK not in ext:
        return None
    try:
        header = json.loads(ext)
    except ValueError:
        return None  # the frame's own header parsing reports a broken ext header
    if not isinstance(header, dict):
        return None
    mark = header.get(CODEC_HEADER)
    if not isinstance(mark, str):
        return None  # go-nsq reads only a string mark
    declared = header.get(SIZE_HEADER)
    size = _size(declared, limit) if isinstance(declared, str) else None
    try:
        number = int(mark)
    except ValueError:
        raise ProtocolError(f"ext header {CODEC_HEADER}={mark!r} is not a codec number") \
            from None
    if number == 0:
        original = body
    else:
        name = _NAMES.get(number)
        if name is None:
            raise ProtocolError(f"ext header {CODEC_HEADER}={mark!r}: unknown codec (known: "
                                + ", ".join(f"{n} {c}" for c, n in CODECS.items()) + ")")
        original = _decompress(name, body, size, limit)
        if size is not None and len(original) != size:
            raise ProtocolError(f"{name} body decompressed to {len(original)} bytes; its "
                                f"{SIZE_HEADER} header says {size}")
    del header[CODEC_HEADER]
    header.pop(SIZE_HEADER, None)
    stripped = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    return original, stripped


def _size(text: str, limit: int) -> int:
    try:
        size = int(text)
    except ValueError:
        raise ProtocolError(f"ext header {SIZE_HEADER}={text!r} is not a size") from None
    if size < 0:
        raise ProtocolError(f"ext header {SIZE_HEADER}={text!r} is not a size")
    if size > limit:
        raise ProtocolError(f"compressed body declares {size} bytes, over the "
                            f"{limit}-byte limit on decompressed bodies")
    return size


def _decompress(name: str, body: bytes, size: int | None, limit: int) -> bytes:
    if name == "gzip":
        return _gunzip(body, limit)
    if name == "snappy":
        snappy = snappy_module()
        wanted = snappy_preamble(body, 0, len(body))
        if wanted > limit:
            raise ProtocolError(f"snappy body declares {wanted} bytes, over the "
                                f"{limit}-byte limit on decompressed bodies")
        try:
            return bytes(snappy.uncompress(body))
        except Exception as exc:  # python-snappy/cramjam raise their own types
            raise ProtocolError(f"snappy body corrupt: {exc or type(exc).__name__}") from None
    block = _lz4()
    room = size if size is not None else min(limit, max(1, len(body)) * _GUESS_RATIO)
    try:
        return bytes(block.decompress(body, uncompressed_size=room))
    except Exception as exc:
        raise ProtocolError(f"lz4 body corrupt or over {room} bytes: {exc}") from None


def _gunzip(body: bytes, limit: int) -> bytes:
    """A gzip stream (one member or several, as Go's reader takes), at most ``limit`` bytes."""
    out = bytearray()
    data = body
    while True:
        unpacker = zlib.decompressobj(31)
        try:
            out += unpacker.decompress(data, limit + 1 - len(out))
        except zlib.error as exc:
            raise ProtocolError(f"gzip body corrupt: {exc}") from None
        if len(out) > limit or unpacker.unconsumed_tail:
            raise ProtocolError(f"gzip body decompresses past the {limit}-byte limit on "
                                "decompressed bodies")
        if not unpacker.eof:
            raise ProtocolError("gzip body ends before its stream does")
        data = unpacker.unused_data
        if not data:
            return bytes(out)

