"""Hypothesis properties of the codec.

* encode/decode round trips for every message layout, and for every command through an
  independent parser (test_commands.reencode);
* any split of a valid stream, real (the captures) or generated, yields the same frames;
* random or truncated garbage yields frames or ``ProtocolError`` only, and the reader never
  holds more than one maximal frame.
"""

from __future__ import annotations

import contextlib
import itertools
import string
from typing import Any

import pytest
from capture import load, tcp_capture_names
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from protocol_helpers import check_capture, layout_for, reencode

from smartnsq import StartPosition
from smartnsq.errors import InvalidArgument, ProtocolError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import (
    CLASSIC_LAYOUT,
    HEARTBEAT,
    HEARTBEAT_FRAME,
    ErrorFrame,
    Frame,
    FrameReader,
    MessageFrame,
    MessageLayout,
    Response,
    encode_error,
    encode_message,
    encode_response,
    partition_of,
    youzan_message_id,
)
from smartnsq.protocol.responses import (
    PublishReceipt,
    encode_publish_receipt,
    parse_auth_response,
    parse_identify_response,
    parse_publish_response,
)

FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

LAYOUTS = [CLASSIC_LAYOUT, MessageLayout(), MessageLayout(ext=True), MessageLayout(detail=True),
           MessageLayout(ext=True, detail=True)]
u16 = st.integers(0, 2**16 - 1)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
bodies = st.binary(min_size=0, max_size=300)
hex_ids = st.text("0123456789abcdef", min_size=16, max_size=16).map(str.encode)
header_names = st.text(string.ascii_letters + string.digits + "#_.-", min_size=1, max_size=12)
# ``##trace_id`` holds a decimal uint64 (validate.check_headers): drawn as one, not as text
headers = st.dictionaries(header_names.filter(lambda name: name != "##trace_id"),
                          st.text(max_size=20), max_size=4) | st.builds(
    lambda rest, trace: {**rest, "##trace_id": str(trace)},
    st.dictionaries(header_names.filter(lambda name: name != "##trace_id"),
                    st.text(max_size=20), max_size=3), u64)


@st.composite
def message_frames(draw: st.DrawFn, layout: MessageLayout) -> tuple[bytes, dict[str, Any]]:
    msg_id = draw(hex_ids) if not layout.youzan else youzan_message_id(draw(u64), draw(u64))
    fields: dict[str, Any] = {"timestamp": draw(i64), "attempts": draw(u16), "id": msg_id,
                              "body": draw(bodies)}
    kwargs: dict[str, Any] = {}
    if layout.ext:
        version = draw(st.sampled_from([0, 2, 4]))
        ext = draw(st.binary(max_size=100)) if version else None
        kwargs.update(ext_version=version, ext=ext)
        fields.update(ext_version=version, ext=ext)
    if layout.detail:
        kwargs.update(queue_offset=draw(u64), raw_size=draw(u32))
        fields.update(queue_offset=kwargs["queue_offset"], raw_size=kwargs["raw_size"])
    frame = encode_message(fields["timestamp"], fields["attempts"], msg_id, fields["body"],
                           layout, **kwargs)
    return frame, fields


def assert_message(msg: Frame, fields: dict[str, Any], layout: MessageLayout) -> None:
    assert isinstance(msg, MessageFrame)
    for key, value in fields.items():
        assert getattr(msg, key) == value, key
    if layout.youzan:
        assert msg.partition == partition_of(msg.internal_id)
        assert msg.id == youzan_message_id(msg.internal_id, msg.trace_id or 0)
    else:
        assert msg.internal_id == int(msg.id, 16)
    if not layout.ext:
        assert msg.ext is None and msg.ext_version == 0
    if not layout.detail:
        assert msg.queue_offset is None and msg.raw_size is None


@pytest.mark.parametrize("layout", LAYOUTS)
@FAST
@given(data=st.data())
def test_message_round_trip(layout: MessageLayout, data: st.DataObject) -> None:
    frame, fields = data.draw(message_frames(layout))
    (msg,) = FrameReader(layout).feed(frame)
    assert_message(msg, fields, layout)


@FAST
@given(headers)
def test_ext_headers_round_trip(hdrs: dict[str, str]) -> None:
    layout = MessageLayout(ext=True, detail=True)
    ext = commands.encode_headers(hdrs)
    (msg,) = FrameReader(layout).feed(encode_message(1, 1, bytes(16), b"b", layout,
                                                     ext_version=4, ext=ext))
    expected = {k: v for k, v in hdrs.items() if k != "##trace_id"}  # that is msg.trace_id
    assert isinstance(msg, MessageFrame) and msg.headers == expected


# -- streams and splits ----------------------------------------------------------------------

@st.composite
def streams(draw: st.DrawFn) -> tuple[MessageLayout, bytes, list[tuple[str, Any]]]:
    layout = draw(st.sampled_from(LAYOUTS))
    parts: list[bytes] = []
    expected: list[tuple[str, Any]] = []
    for _ in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["msg", "msg", "resp", "err", "hb"]))
        if kind == "msg":
            frame, fields = draw(message_frames(layout))
            parts.append(frame)
            expected.append(("msg", fields))
        elif kind == "resp":
            payload = draw(st.binary(max_size=40))
            assume(payload != b"_heartbeat_")
            parts.append(encode_response(payload))
            expected.append(("resp", payload))
        elif kind == "err":
            payload = draw(st.binary(max_size=40))
            parts.append(encode_error(payload))
            expected.append(("err", payload))
        else:
            parts.append(HEARTBEAT_FRAME)
            expected.append(("hb", None))
    return layout, b"".join(parts), expected


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def check_stream(frames: list[Frame], expected: list[tuple[str, Any]],
                 layout: MessageLayout) -> None:
    assert len(frames) == len(expected)
    for frame, (kind, value) in zip(frames, expected, strict=True):
        if kind == "msg":
            assert_message(frame, value, layout)
        elif kind == "resp":
            assert frame == Response(value)
        elif kind == "err":
            assert frame == ErrorFrame(value)
        else:
            assert frame is HEARTBEAT


@FAST
@given(streams(), st.lists(st.integers(0, 10**6), max_size=40))
def test_any_split_of_a_generated_stream(stream: tuple[MessageLayout, bytes, list[Any]],
                                         cuts: list[int]) -> None:
    layout, data, expected = stream
    reader = FrameReader(layout)
    frames: list[Frame] = []
    for piece in splits(data, cuts):
        frames += reader.feed(piece)
    assert reader.buffered == 0
    check_stream(frames, expected, layout)


CAPTURES = [n for n in tcp_capture_names() if load(n).frames()]


@FAST
@given(st.sampled_from(CAPTURES), st.lists(st.integers(0, 10**6), max_size=60))
def test_any_split_of_a_captured_stream(name: str, cuts: list[int]) -> None:
    cap = load(name)
    reader = FrameReader(layout_for(cap))
    frames: list[Frame] = []
    for piece in splits(cap.stream(), cuts):
        frames += reader.feed(piece)
    assert reader.buffered == 0
    check_capture(cap, frames)


@FAST
@given(streams(), st.integers(0, 10**6))
def test_truncated_stream_yields_a_prefix(stream: tuple[MessageLayout, bytes, list[Any]],
                                          cut: int) -> None:
    layout, data, expected = stream
    cut %= len(data) + 1
    reader = FrameReader(layout)
    frames = reader.feed(data[:cut])
    check_stream(frames, expected[:len(frames)], layout)
    assert reader.buffered == cut - sum(len(f) for f in _frame_sizes(data, len(frames)))
    rest = reader.feed(data[cut:])
    check_stream(frames + rest, expected, layout)


def _frame_sizes(data: bytes, n: int) -> list[bytes]:
    out, pos = [], 0
    for _ in range(n):
        size = int.from_bytes(data[pos:pos + 4], "big")
        out.append(data[pos:pos + 4 + size])
        pos += 4 + size
    return out


# -- garbage -------------------------------------------------------------------------------

MAX = 1024


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(LAYOUTS), st.lists(st.binary(max_size=600), max_size=12))
def test_garbage_raises_only_protocol_error(layout: MessageLayout, chunks: list[bytes]) -> None:
    reader = FrameReader(layout, max_frame_size=MAX)
    for chunk in chunks:
        try:
            frames = reader.feed(chunk)
        except ProtocolError:
            with pytest.raises(ProtocolError):
                reader.feed(b"\x00" * 8)
            assert reader.buffered == 0
            return
        assert reader.buffered <= MAX + 4
        for frame in frames:
            assert isinstance(frame, MessageFrame | Response | ErrorFrame) or frame is HEARTBEAT
            if isinstance(frame, MessageFrame):
                # (a classic "id" of non-hex bytes has no integer value: ValueError)
                with contextlib.suppress(ProtocolError, ValueError):
                    _ = frame.headers, frame.internal_id, repr(frame)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**31), 2**31 - 1),
                          st.binary(max_size=64)), max_size=10))
def test_garbage_headers_raise_only_protocol_error(
        frames: list[tuple[int, int, bytes]]) -> None:
    """Random sizes and frame types, the fields most likely to upset a decoder."""
    reader = FrameReader(MessageLayout(ext=True, detail=True), max_frame_size=MAX)
    data = b"".join(s.to_bytes(4, "big", signed=True) + t.to_bytes(4, "big", signed=True) + p
                    for s, t, p in frames)
    try:
        reader.feed(data)
    except ProtocolError:
        return
    assert reader.buffered <= MAX + 4


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=80))
def test_response_parsers_raise_only_protocol_error(data: bytes) -> None:
    for parse in (parse_publish_response, parse_identify_response, parse_auth_response):
        with contextlib.suppress(ProtocolError):
            parse(data)


@pytest.mark.parametrize("data", [b"[" * 100_000, b'{"a":' * 100_000], ids=["list", "object"])
def test_deeply_nested_json_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_identify_response(data)
    with pytest.raises(ProtocolError):
        parse_auth_response(data)
    layout = MessageLayout(ext=True)
    (msg,) = FrameReader(layout).feed(encode_message(1, 1, bytes(16), b"b", layout,
                                                     ext_version=4, ext=data[:60_000]))
    assert isinstance(msg, MessageFrame)
    with pytest.raises(ProtocolError):
        _ = msg.headers


@FAST
@given(u64, u64, u64, u32)
def test_publish_receipt_round_trip(iid: int, tid: int, offset: int, size: int) -> None:
    receipt = PublishReceipt(iid, tid, offset, size)
    data = encode_publish_receipt(receipt)
    assert len(data) == 30 and parse_publish_response(data) == receipt
    assert receipt.partition == (iid >> 50) & 0x3FF


# -- commands through an independent parser ------------------------------------------------

names = st.text(string.ascii_letters + string.digits + "._-", min_size=1, max_size=64)
channels = st.one_of(names, names.filter(lambda n: len(n) <= 54).map(lambda n: n + "#ephemeral"))
partitions = st.one_of(st.none(), st.integers(0, 1023))
msg_bodies = st.binary(min_size=1, max_size=200)


@FAST
@given(names, channels, partitions, msg_bodies, u64, st.lists(msg_bodies, min_size=1,
                                                                  max_size=5),
       st.binary(min_size=16, max_size=16), st.integers(0, 10**9))
def test_commands_round_trip(topic: str, channel: str, partition: int | None, body: bytes,
                             trace_id: int, batch: list[bytes], raw_id: bytes,
                             delay: int) -> None:
    built = [
        commands.sub(topic, channel, partition),
        commands.sub_advanced(topic, channel, partition),
        commands.pub(topic, body, partition),
        commands.mpub(topic, batch, partition),
        commands.pub_trace(topic, body, trace_id, partition),
        commands.mpub_trace(topic, [(trace_id, b) for b in batch], partition),
        commands.dpub(topic, delay, body),
        commands.fin(raw_id), commands.touch(raw_id), commands.req(raw_id, delay),
        commands.rdy(delay),
    ]
    if partition is not None:
        built.append(commands.sub_ordered(topic, channel, partition))
    for data in built:
        assert reencode(data) == data
        line = data[:data.index(b"\n")] if not data.startswith((b"FIN", b"REQ", b"TOUCH")) \
            else b""
        assert b"  " not in line and not line.endswith(b" ")


@FAST
@given(st.sampled_from(["timestamp", "virtual_queue", "msgcount"]), u64)
def test_start_position_token(kind: Any, value: int) -> None:
    pos = StartPosition(kind, value)
    assert pos.token() == f"{kind}:{value}".encode()
    line = commands.sub_advanced("t", "c", 3, pos)
    assert line == f"SUB_ADVANCED t c 3 {kind}:{value}\n".encode()


@FAST
@given(st.text(max_size=70))
def test_names_are_accepted_iff_valid(name: str) -> None:
    import re
    valid = re.fullmatch(r"[.a-zA-Z0-9_-]+(#ephemeral)?", name) is not None and len(name) <= 64
    try:
        data = commands.sub(name, "c")
    except InvalidArgument as exc:
        assert not valid and exc.field == "topic"
    else:
        assert valid and data == b"SUB " + name.encode() + b" c\n"
