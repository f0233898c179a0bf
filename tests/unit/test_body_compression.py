"""Bodies compressed by go-nsq's rules (its compress.go / message.go), decoded by
``smartnsq.protocol.body_compression``; the messages here are built independently of it, with
the standard gzip module and the snappy and lz4 packages, as a go-nsq producer writes them."""

from __future__ import annotations

import gzip
import json
import sys

import lz4.block
import pytest
import snappy
from hypothesis import given
from hypothesis import strategies as st

from smartnsq.errors import ProtocolError
from smartnsq.protocol.body_compression import CODECS, compress, unpack

LIMIT = 1 << 20
BODY = b"order 42 " * 400


def go_nsq(codec: int, body: bytes, *, size: str | int | None = "auto",
           extra: dict[str, object] | None = None) -> tuple[bytes, bytes]:
    """(ext, body) as a go-nsq producer sends them: the codec number and size as strings."""
    packed = {1: gzip.compress, 2: snappy.compress,
              3: lambda b: lz4.block.compress(b, store_size=False), 0: bytes}[codec](body)
    header: dict[str, object] = dict(extra or {})
    header["nsq.client.compress"] = str(codec)
    if size == "auto":
        header["nsq.msg.size"] = str(len(body))
    elif size is not None:
        header["nsq.msg.size"] = size
    return json.dumps(header).encode(), packed


@pytest.mark.parametrize("codec", [0, 1, 2, 3])
def test_each_codec_decodes_to_the_original_and_drops_both_keys(codec: int) -> None:
    ext, packed = go_nsq(codec, BODY, extra={"##trace_id": "7", "k": "v"})
    got = unpack(ext, packed, LIMIT)
    assert got is not None
    body, stripped = got
    assert body == BODY
    assert json.loads(stripped) == {"##trace_id": "7", "k": "v"}


def test_unmarked_headers_are_left_alone() -> None:
    assert unpack(b'{"k":"v"}', b"plain", LIMIT) is None
    assert unpack(b"", b"plain", LIMIT) is None
    # go-nsq reads only a string mark: a number is no mark, the body goes as it is
    assert unpack(b'{"nsq.client.compress":2}', b"plain", LIMIT) is None


def test_without_a_size_header_the_codecs_still_decode() -> None:
    for codec in (1, 2):
        ext, packed = go_nsq(codec, BODY, size=None)
        assert unpack(ext, packed, LIMIT) == (BODY, b"{}")
    # lz4 needs an output size: go-nsq's guess of 10x the compressed length
    mixed = bytes(range(256)) * 4
    ext, packed = go_nsq(3, mixed, size=None)
    assert unpack(ext, packed, LIMIT) == (mixed, b"{}")


@pytest.mark.parametrize("ext, body, words", [
    (b'{"nsq.client.compress":"9"}', b"x", "unknown codec"),
    (b'{"nsq.client.compress":"gzip"}', b"x", "not a codec number"),
    (b'{"nsq.client.compress":"1","nsq.msg.size":"ten"}', b"x", "not a size"),
    (b'{"nsq.client.compress":"1","nsq.msg.size":"-1"}', b"x", "not a size"),
    (b'{"nsq.client.compress":"1"}', b"not gzip at all", "gzip body corrupt"),
    (b'{"nsq.client.compress":"2"}', b"\x05abc", "snappy body corrupt"),
    (b'{"nsq.client.compress":"3","nsq.msg.size":"100"}', b"\xff\xff", "lz4 body corrupt"),
])
def test_a_mark_that_cannot_be_honoured_is_an_error(ext: bytes, body: bytes,
                                                    words: str) -> None:
    with pytest.raises(ProtocolError, match=words):
        unpack(ext, body, LIMIT)


def test_a_size_mismatch_is_corruption() -> None:
    ext, packed = go_nsq(1, BODY, size=str(len(BODY) - 1))
    with pytest.raises(ProtocolError, match="says"):
        unpack(ext, packed, LIMIT)


@pytest.mark.parametrize("codec", [1, 2, 3])
def test_decompression_is_bounded(codec: int) -> None:
    bomb = b"\0" * (4 * LIMIT)
    ext, packed = go_nsq(codec, bomb, size=None)
    with pytest.raises(ProtocolError):
        unpack(ext, packed, LIMIT)
    ext, packed = go_nsq(codec, bomb)  # declared: refused before any output is made
    with pytest.raises(ProtocolError, match="limit"):
        unpack(ext, packed, LIMIT)


def test_gzip_members_concatenated_read_as_go_reads_them() -> None:
    packed = gzip.compress(b"ab") + gzip.compress(b"cd")
    assert unpack(b'{"nsq.client.compress":"1"}', packed, LIMIT) == (b"abcd", b"{}")
    with pytest.raises(ProtocolError, match="ends before"):
        unpack(b'{"nsq.client.compress":"1"}', gzip.compress(BODY)[:-9], LIMIT)


def test_a_missing_lz4_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    ext, packed = go_nsq(3, BODY)
    monkeypatch.setitem(sys.modules, "lz4.block", None)
    monkeypatch.setitem(sys.modules, "lz4", None)
    with pytest.raises(ProtocolError, match=r"smartnsq\[lz4\]"):
        unpack(ext, packed, LIMIT)


@pytest.mark.parametrize("codec", list(CODECS))
def test_compress_writes_what_go_nsq_reads(codec: str) -> None:
    packed = compress(codec, BODY)  # type: ignore[arg-type]
    assert packed is not None
    data, headers = packed
    assert headers == {"nsq.client.compress": str(CODECS[codec]),
                       "nsq.msg.size": str(len(BODY))}
    # decoded independently, as go-nsq's consumer does (lz4: a buffer of the declared size)
    plain = {"gzip": gzip.decompress, "snappy": snappy.uncompress,
             "lz4": lambda d: lz4.block.decompress(d, uncompressed_size=len(BODY))}[codec](data)
    assert plain == BODY


def test_incompressible_bodies_are_sent_as_they_are() -> None:
    assert compress("gzip", b"ab") is None
    with pytest.raises(ValueError, match="unknown body codec"):
        compress("zstd", BODY)  # type: ignore[arg-type]


@given(body=st.binary(min_size=1, max_size=4096), codec=st.sampled_from(list(CODECS)))
def test_round_trip(body: bytes, codec: str) -> None:
    packed = compress(codec, body)  # type: ignore[arg-type]
    if packed is None:
        return
    data, headers = packed
    assert unpack(json.dumps(headers).encode(), data, LIMIT) == (body, b"{}")
