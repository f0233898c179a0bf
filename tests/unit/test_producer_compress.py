"""``ProducerConfig.compress`` and the producer's body compression (``encoding.compress_body``):
which publishes are compressed, and the ext header they carry."""

from __future__ import annotations

import json
import random

import pytest

from smartnsq import BodyCompression, Producer, ProducerConfig
from smartnsq.errors import InvalidArgument
from smartnsq.producer.encoding import compress_body
from smartnsq.producer.request import Request
from smartnsq.protocol import body_compression
from smartnsq.protocol.validate import MAX_EXT_LENGTH

BIG = b"abcdefgh" * 4000


def request(body: bytes = BIG, ext: bytes | None = None, trace_id: int | None = None,
            topic: str = "t") -> Request:
    return Request(topic, body, None, None, trace_id, ext, None, 10.0, 0.0)


@pytest.mark.parametrize("value", [
    "gzip", {"t": "gzip"}, {1: BodyCompression()}, [BodyCompression()],
])
def test_compress_refuses_what_is_not_settings(value: object) -> None:
    with pytest.raises(InvalidArgument, match="compress"):
        ProducerConfig(compress=value)  # type: ignore[arg-type]


def test_a_codec_or_size_out_of_range_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="codec"):
        BodyCompression("zstd")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="min_size"):
        BodyCompression(min_size=0)


def test_the_producer_takes_the_option() -> None:
    producer = Producer(nsqd="127.0.0.1:4150", compress=BodyCompression("lz4"))
    assert producer.config.compress == BodyCompression("lz4", 20480)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4"])
def test_a_large_body_is_compressed_and_marked(codec: body_compression.BodyCodec) -> None:
    r = request(ext=b'{"k":"v"}')
    compress_body(r, BodyCompression(codec))
    assert r.ext is not None
    headers = json.loads(r.ext)
    assert headers == {"k": "v", "nsq.client.compress": str(body_compression.CODECS[codec]),
                       "nsq.msg.size": str(len(BIG))}
    assert body_compression.unpack(r.ext, r.body, len(BIG)) == (BIG, b'{"k":"v"}')


def test_a_trace_id_moves_into_the_header() -> None:
    r = request(trace_id=9)
    compress_body(r, BodyCompression())
    assert r.ext is not None and json.loads(r.ext)["##trace_id"] == "9"


def test_what_is_left_alone() -> None:
    small = request(b"x" * 100)
    compress_body(small, BodyCompression())
    assert small.body == b"x" * 100 and small.ext is None
    other = request(topic="other")
    compress_body(other, {"t": BodyCompression()})
    assert other.body == BIG and other.ext is None
    marked = request(ext=b'{"nsq.client.compress":"0"}')
    compress_body(marked, BodyCompression())  # the caller's own marks (or a retry's)
    assert marked.body == BIG
    noise = request(random.Random(1).randbytes(30000))  # does not shrink
    compress_body(noise, BodyCompression("lz4"))
    assert noise.ext is None
    full = b'{"k":"' + b"v" * (MAX_EXT_LENGTH - 10) + b'"}'
    crowded = request(ext=full)  # no room for the marks in the ext header
    compress_body(crowded, BodyCompression())
    assert crowded.body == BIG and crowded.ext == full


def test_once_compressed_a_retry_does_not_compress_again() -> None:
    r = request()
    setting = BodyCompression()
    compress_body(r, setting)
    once = (r.body, r.ext)
    compress_body(r, setting)
    assert (r.body, r.ext) == once
