"""``columns.run_batch`` (the read path's columnwise Arrow builder) against
``schema.message_batch`` (the per-message one, which the ack source keeps): the same record
batch, value for value, type for type and null for null, on random messages as the frame
decoder makes them, or the same error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from smartnsq.errors import ProtocolError
from smartnsq.protocol.body_compression import compress
from smartnsq.protocol.frames import (
    FrameReader,
    MessageFrame,
    MessageLayout,
    encode_message,
    youzan_message_id,
)
from smartnsq.protocol.runs import MessageRun, RunReader
from smartnsq.spark.columns import run_batch
from smartnsq.spark.schema import arrow_schema, message_batch

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=12)
header_values = st.one_of(texts, st.integers(), st.booleans(), st.none(),
                          st.lists(st.integers(), max_size=2))


@st.composite
def ext_headers(draw: Any) -> tuple[int, bytes | None]:
    """No ext, an empty one, JSON objects (with the key header, the server's trace key and
    non-string values), compressed bodies' marks, or bytes that are not JSON."""
    kind = draw(st.sampled_from(["none", "empty", "json", "json", "marked", "bad", "v2"]))
    if kind == "none":
        return 0, None
    if kind == "empty":
        return 4, b""
    if kind == "v2":
        return 2, draw(st.binary(min_size=1, max_size=20))
    if kind == "bad":
        return 4, draw(st.sampled_from([b"{", b"[1, 2]", b"not json", b'"s"']))
    headers = draw(st.dictionaries(st.sampled_from(["key", "k", "##trace_id", "x", "y"]) | texts,
                                   header_values, max_size=4))
    if kind == "marked":
        headers["nsq.client.compress"] = draw(st.sampled_from(["1", "9", 1, "0"]))
        headers["nsq.msg.size"] = draw(st.sampled_from(["5", "1000000", "x"]))
    return 4, json.dumps(headers).encode()


@st.composite
def youzan_messages(draw: Any, partition: int) -> MessageFrame:
    internal = draw(st.integers(0, 2**50 - 1)) | (partition << 50) | \
        draw(st.sampled_from([0, 1 << 63]))
    version, ext = draw(ext_headers())
    body = draw(st.binary(max_size=40))
    if ext is not None and b"nsq.client.compress" in ext and draw(st.booleans()):
        packed = compress("gzip", body * 20)
        if packed is not None:  # a body that really decodes
            body = packed[0]
            ext = json.dumps({**json.loads(ext), **packed[1]}).encode()
    return MessageFrame(draw(i64), draw(st.integers(0, 2**16 - 1)),
                        youzan_message_id(internal, draw(u64)), body, version, ext,
                        draw(st.integers(0, 2**40)), draw(st.integers(0, 2**31 - 1)), True)


def _same(topic: str, node: str, messages: list[MessageFrame], key_header: str,
          limit: int | None, run: MessageRun | None = None) -> None:
    run = MessageRun.of(messages) if run is None else run
    try:
        expected = message_batch(topic, node, messages, key_header, limit)
    except ProtocolError as exc:
        with pytest.raises(ProtocolError) as raised:
            run_batch(topic, node, run, key_header, limit)
        assert str(raised.value) == str(exc)
        return
    got = run_batch(topic, node, run, key_header, limit)
    assert got.schema.equals(arrow_schema())
    assert got.equals(expected), (got.to_pylist(), expected.to_pylist())
    assert got.to_pylist() == expected.to_pylist()


@SETTINGS
@given(partition=st.integers(0, 1023), data=st.data(),
       key_header=st.sampled_from(["key", "k", "x"]),
       limit=st.sampled_from([None, 1 << 20, 10]))
def test_the_same_batch_as_message_by_message(partition: int, data: Any, key_header: str,
                                               limit: int | None) -> None:
    messages = data.draw(st.lists(youzan_messages(partition), max_size=12))
    _same("orders", "127.0.0.1:4150", messages, key_header, limit)


@SETTINGS
@given(data=st.data(), ext=st.booleans())
def test_the_same_batch_from_decoded_frames(data: Any, ext: bool) -> None:
    """Messages as the range reader gets them: frames encoded, then decoded into a run."""
    layout = MessageLayout(ext=ext, detail=True)
    frames = []
    for _ in range(data.draw(st.integers(1, 10))):
        version, raw = data.draw(ext_headers()) if ext else (0, None)
        frames.append(encode_message(
            data.draw(i64), data.draw(st.integers(0, 2**16 - 1)),
            youzan_message_id(data.draw(u64), data.draw(u64)), data.draw(st.binary(max_size=30)),
            layout, ext_version=version, ext=raw, queue_offset=data.draw(st.integers(0, 2**40)),
            raw_size=data.draw(st.integers(0, 2**31 - 1))))
    messages = FrameReader(layout).feed(b"".join(frames))
    assert all(isinstance(m, MessageFrame) for m in messages)
    (item,) = RunReader(layout).feed_runs(b"".join(frames))
    run = item if isinstance(item, MessageRun) else MessageRun.of([item])  # type: ignore[list-item]
    _same("t", "n", messages, "key", 1 << 20, run)  # type: ignore[arg-type]


def test_odd_ids_and_empty_runs_take_the_message_path() -> None:
    odd = [MessageFrame(1, 1, youzan_message_id(1 << 50, 2) + b"more", b"b", 0, None, 0, 30, True)]
    _same("t", "n", odd, "key", None)
    _same("t", "n", [], "key", None)
