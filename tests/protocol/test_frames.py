"""The incremental frame decoder against every server frame real nsqd sent in the captures.

Each capture's server bytes are decoded as one stream and compared, field by field, with the
capture script's own decoding of each frame. The message layout is chosen from the
connection's state as the capture records it (IDENTIFY ``extend_support`` and the subscribe
command), never from the frame bytes.
"""

from __future__ import annotations

import struct

import pytest
from capture import Capture, load, tcp_capture_names
from protocol_helpers import check_capture, layout_for

from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import (
    CLASSIC_LAYOUT,
    DEFAULT_MAX_FRAME_SIZE,
    HEARTBEAT,
    HEARTBEAT_FRAME,
    YOUZAN_LAYOUT,
    ErrorFrame,
    Frame,
    FrameReader,
    Heartbeat,
    MessageFrame,
    MessageLayout,
    Response,
    encode_error,
    encode_message,
    encode_response,
    partition_of,
    youzan_message_id,
)

CAPTURES = tcp_capture_names()

def chunks(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def decode(cap: Capture, pieces: list[bytes], layout: MessageLayout | None = None) -> list[Frame]:
    reader = FrameReader(layout or layout_for(cap))
    out: list[Frame] = []
    for piece in pieces:
        out += reader.feed(piece)
    assert reader.buffered == 0
    return out


def test_captures_cover_every_layout_and_frame_kind() -> None:
    kinds: set[str] = set()
    layouts = set()
    for name in CAPTURES:
        cap = load(name)
        for e in cap.frames():
            assert e.expected is not None
            kinds.add(e.expected.kind)
            if e.expected.kind == "MESSAGE":
                layouts.add(layout_for(cap))
            if e.expected.payload == b"_heartbeat_":
                kinds.add("HEARTBEAT")
    assert kinds == {"RESPONSE", "ERROR", "MESSAGE", "HEARTBEAT"}
    assert layouts == {CLASSIC_LAYOUT, YOUZAN_LAYOUT, MessageLayout(ext=True),
                       MessageLayout(detail=True)}


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_stream_in_one_chunk(name: str) -> None:
    cap = load(name)
    check_capture(cap, decode(cap, [cap.stream()]))


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_as_recorded(name: str) -> None:
    """One feed per recorded read, as a socket would have delivered them."""
    cap = load(name)
    check_capture(cap, decode(cap, [e.data for e in cap.recvs()]))


@pytest.mark.parametrize("name", CAPTURES)
def test_capture_one_byte_at_a_time(name: str) -> None:
    cap = load(name)
    data = cap.stream()
    check_capture(cap, decode(cap, [data[i:i + 1] for i in range(len(data))]))


@pytest.mark.parametrize("size", [2, 3, 5, 7, 8, 9, 13, 26, 64, 255])
def test_all_captures_in_fixed_chunks(size: int) -> None:
    for name in CAPTURES:
        cap = load(name)
        check_capture(cap, decode(cap, chunks(cap.stream(), size)))


def test_hundreds_of_frames_in_one_chunk() -> None:
    cap = load("youzan/tcp_06_sub_rdy_fin_req_touch.txt")
    stream = cap.stream()
    per_copy = len(cap.frames())
    copies = 500 // per_copy + 1
    frames = decode(cap, [stream * copies])
    assert len(frames) == per_copy * copies >= 500
    for i in range(copies):
        check_capture(cap, frames[i * per_copy:(i + 1) * per_copy])
    # the same, split at an awkward place in the middle
    big = stream * copies
    cut = len(big) // 2 + 3
    again = decode(cap, [big[:cut], big[cut:]])
    for i in range(copies):
        check_capture(cap, again[i * per_copy:(i + 1) * per_copy])


def test_partial_frame_is_held_then_completed() -> None:
    frame = load("youzan/tcp_07_sub_advanced_detail.txt").frames()[-1].data
    reader = FrameReader(MessageLayout(detail=True))
    assert reader.feed(frame[:3]) == []
    assert reader.buffered == 3
    assert reader.feed(frame[3:20]) == []
    assert reader.buffered == 20
    (msg,) = reader.feed(frame[20:] + HEARTBEAT_FRAME[:5])
    assert isinstance(msg, MessageFrame) and msg.body == b"adv-msg"
    assert reader.buffered == 5
    assert reader.feed(HEARTBEAT_FRAME[5:]) == [HEARTBEAT]
    assert reader.buffered == 0


# -- heartbeats ----------------------------------------------------------------------------

def test_heartbeat_recognised_from_capture() -> None:
    cap = load("classic/tcp_10_heartbeat.txt")
    frames = decode(cap, [cap.stream()], CLASSIC_LAYOUT)
    assert frames.count(HEARTBEAT) == 4
    assert all(isinstance(f, Heartbeat) for f in frames[1:])
    assert HEARTBEAT_FRAME == cap.frames()[1].data == encode_response(b"_heartbeat_")


def test_near_heartbeats_are_plain_responses() -> None:
    reader = FrameReader()
    frames = reader.feed(encode_response(b"_heartbeat") + encode_response(b"_heartbeat__")
                         + encode_error(b"_heartbeat_"))
    assert frames == [Response(b"_heartbeat"), Response(b"_heartbeat__"),
                      ErrorFrame(b"_heartbeat_")]


# -- limits and malformed input ------------------------------------------------------------

def test_oversized_frame_raises_without_buffering() -> None:
    reader = FrameReader(max_frame_size=1024)
    header = struct.pack(">ii", 4 + 2000, 2)
    with pytest.raises(ProtocolError, match="2004"):
        reader.feed(header)
    assert reader.buffered == 0
    with pytest.raises(ProtocolError):  # the stream is not trusted any more
        reader.feed(encode_response(b"OK"))


def test_oversized_frame_detected_from_the_size_alone() -> None:
    reader = FrameReader(max_frame_size=100)
    with pytest.raises(ProtocolError):
        reader.feed(struct.pack(">i", 105))
    assert reader.buffered == 0


def test_oversized_frame_after_good_frames_in_one_chunk() -> None:
    reader = FrameReader(max_frame_size=100)
    with pytest.raises(ProtocolError):
        reader.feed(encode_response(b"OK") + struct.pack(">ii", 5000, 0) + bytes(50))
    assert reader.buffered == 0


def test_frame_at_the_limit_is_accepted() -> None:
    reader = FrameReader(max_frame_size=104)
    frame = encode_response(b"x" * 100)
    assert reader.feed(frame[:50]) == []
    assert reader.feed(frame[50:]) == [Response(b"x" * 100)]
    assert DEFAULT_MAX_FRAME_SIZE > 5 * 1024 * 1024  # above the server's max_body_size


@pytest.mark.parametrize("data", [
    struct.pack(">ii", 3, 0),                  # size below 4
    struct.pack(">ii", -1, 0),                 # negative size
    struct.pack(">ii", 0, 0),
    struct.pack(">ii", 6, 3) + b"OK",          # unknown frame type
    struct.pack(">ii", 6, -1) + b"OK",
    struct.pack(">ii", 4 + 25, 2) + bytes(25),  # message shorter than 26 bytes
])
def test_malformed_frames_raise(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameReader().feed(data)


@pytest.mark.parametrize(("layout", "tail"), [
    (MessageLayout(ext=True), b""),                           # no ext version byte
    (MessageLayout(ext=True), b"\x04\x00"),                   # ext length cut
    (MessageLayout(ext=True), b"\x04\x00\x09{}"),             # ext overruns the frame
    (MessageLayout(detail=True), bytes(11)),                  # detail cut
    (MessageLayout(ext=True, detail=True), b"\x00" + bytes(5)),
])
def test_truncated_blocks_raise(layout: MessageLayout, tail: bytes) -> None:
    payload = struct.pack(">qH", 1, 1) + bytes(16) + tail
    with pytest.raises(ProtocolError):
        FrameReader(layout).feed(struct.pack(">ii", 4 + len(payload), 2) + payload)


def test_bad_ext_json_raises_protocol_error_only_when_read() -> None:
    frame = encode_message(1, 1, bytes(16), b"b", MessageLayout(ext=True), ext_version=4,
                           ext=b"{nope")
    (msg,) = FrameReader(MessageLayout(ext=True)).feed(frame)
    assert isinstance(msg, MessageFrame) and msg.body == b"b"
    with pytest.raises(ProtocolError):
        _ = msg.headers
    frame = encode_message(1, 1, bytes(16), b"b", MessageLayout(ext=True), ext_version=4,
                           ext=b"[1]")
    (msg,) = FrameReader(MessageLayout(ext=True)).feed(frame)
    assert isinstance(msg, MessageFrame)
    with pytest.raises(ProtocolError):
        _ = msg.headers


# -- layouts (docs/protocol.md §4.4) -------------------------------------------------------

WORKED_EXAMPLE = bytes.fromhex(
    "00 00 00 38 00 00 00 02"
    "17 97 9c fe 36 2a 00 00" "00 01"
    "00 04 00 00 00 00 00 2a" "00 00 00 00 00 00 30 39"
    "04 00 09 7b 22 6b 22 3a 22 76 22 7d"
    "00 00 00 00 00 00 10 00 00 00 00 3c"
    "68 69")


def test_worked_example_ext_and_detail() -> None:
    """docs/protocol.md §4.4: ext topic, extend_support, SUB_ORDERED."""
    layout = MessageLayout.for_subscription(youzan=True, extend_support=True,
                                            command="SUB_ORDERED")
    assert layout == MessageLayout(youzan=True, ext=True, detail=True)
    (msg,) = FrameReader(layout).feed(WORKED_EXAMPLE)
    assert isinstance(msg, MessageFrame)
    assert msg.timestamp == 1700000000000000000
    assert msg.attempts == 1
    assert msg.internal_id == (1 << 50) | 42 and msg.partition == 1
    assert msg.trace_id == 12345
    assert msg.id == youzan_message_id((1 << 50) | 42, 12345)
    assert msg.ext_version == 4 and msg.ext == b'{"k":"v"}' and msg.headers == {"k": "v"}
    assert msg.queue_offset == 4096 and msg.raw_size == 60
    assert msg.body == b"hi"
    assert encode_message(1700000000000000000, 1, msg.id, b"hi", layout, ext_version=4,
                          ext=b'{"k":"v"}', queue_offset=4096, raw_size=60) == WORKED_EXAMPLE


@pytest.mark.parametrize(("ext", "command", "expected"), [
    (False, "SUB", MessageLayout()),
    (False, "SUB_ORDERED", MessageLayout(detail=True)),
    (False, "SUB_ADVANCED", MessageLayout(detail=True)),
    (True, "SUB", MessageLayout(ext=True)),
    (True, "SUB_ORDERED", MessageLayout(ext=True, detail=True)),
    (True, "SUB_ADVANCED", MessageLayout(ext=True, detail=True)),
])
def test_layout_table(ext: bool, command: str, expected: MessageLayout) -> None:
    assert MessageLayout.for_subscription(youzan=True, extend_support=ext,
                                          command=command) == expected


def test_classic_has_no_optional_blocks() -> None:
    assert MessageLayout.for_subscription(youzan=False, extend_support=False,
                                          command="SUB") == CLASSIC_LAYOUT
    for ext, command in ((True, "SUB"), (False, "SUB_ORDERED")):
        with pytest.raises(ValueError):
            MessageLayout.for_subscription(youzan=False, extend_support=ext, command=command)


def test_same_bytes_decode_differently_by_state() -> None:
    """Nothing in a frame tells the layout: the same bytes mean different things."""
    frame = load("youzan/tcp_07_sub_advanced_detail.txt").frames()[-1].data
    (detail,) = FrameReader(MessageLayout(detail=True)).feed(frame)
    (plain,) = FrameReader(YOUZAN_LAYOUT).feed(frame)
    assert isinstance(detail, MessageFrame) and isinstance(plain, MessageFrame)
    assert detail.body == b"adv-msg" and detail.raw_size == 37
    assert plain.body == bytes(8) + b"\x00\x00\x00\x25adv-msg"
    assert plain.queue_offset is None


def test_layout_switch_applies_to_later_frames() -> None:
    ext_cap = load("youzan/tcp_15_ext_topic.txt")
    ext_frame = ext_cap.frames()[-1].data        # ext version 0 + body
    detail_frame = load("youzan/tcp_14_ordered_sub_ordered_consume.txt").frames()[-1].data
    reader = FrameReader(MessageLayout(ext=True))
    (a,) = reader.feed(ext_frame + detail_frame[:30])
    reader.layout = MessageLayout(detail=True)
    assert reader.layout == MessageLayout(detail=True)
    (b,) = reader.feed(detail_frame[30:])
    assert isinstance(a, MessageFrame) and a.body == b"plain-body-on-ext-topic"
    assert isinstance(b, MessageFrame) and b.body == b"ordered-b1" and b.queue_offset == 200


def test_legacy_ext_version_2_is_length_and_bytes() -> None:
    layout = MessageLayout(ext=True)
    frame = encode_message(5, 2, youzan_message_id(9, 1), b"body", layout, ext_version=2,
                           ext=b"tag-a")
    (msg,) = FrameReader(layout).feed(frame)
    assert isinstance(msg, MessageFrame)
    assert msg.ext_version == 2 and msg.ext == b"tag-a" and msg.headers == {}
    assert msg.body == b"body" and msg.attempts == 2 and msg.timestamp == 5


def test_unsigned_fields_at_their_maximum() -> None:
    layout = MessageLayout(ext=True, detail=True)
    ext = b'{"k":"' + b"v" * 200 + b'"}'
    frame = encode_message(-1, 0xFFFF, b"\xff" * 16, b"x", layout, ext_version=4, ext=ext,
                           queue_offset=2**64 - 1, raw_size=2**32 - 1)
    (msg,) = FrameReader(layout).feed(frame)
    assert isinstance(msg, MessageFrame)
    assert msg.attempts == 0xFFFF and msg.internal_id == 2**64 - 1 and msg.partition == 0x3FF
    assert msg.trace_id == 2**64 - 1 and msg.queue_offset == 2**64 - 1
    assert msg.raw_size == 2**32 - 1 and msg.ext == ext and msg.timestamp == -1


def test_ext_headers_with_non_string_values() -> None:
    layout = MessageLayout(ext=True)
    frame = encode_message(1, 1, bytes(16), b"x", layout, ext_version=4,
                           ext=b'{"n":1,"b":true,"s":"v","o":{"a":1}}')
    (msg,) = FrameReader(layout).feed(frame)
    assert isinstance(msg, MessageFrame)
    assert msg.headers == {"n": "1", "b": "true", "s": "v", "o": '{"a": 1}'}


def test_empty_body_message() -> None:
    (msg,) = FrameReader().feed(encode_message(1, 1, bytes(16), b""))
    assert isinstance(msg, MessageFrame) and msg.body == b""


def test_message_ids_keep_newlines_and_spaces() -> None:
    raw = b"\n\n \x00 \n\x0a\x20" + bytes(8)
    (msg,) = FrameReader().feed(encode_message(1, 1, raw, b"b"))
    assert isinstance(msg, MessageFrame) and msg.id == raw


# -- partition ------------------------------------------------------------------------------

@pytest.mark.parametrize(("internal_id", "partition"), [
    (0, 0), (2, 0), ((1 << 50) | 42, 1), (2**50 + 2, 1), (1023 << 50, 1023),
    ((1 << 60) | (5 << 50) | 7, 5), (2**64 - 1, 1023), ((1 << 50) - 1, 0),
    (1125899906842626, 1), (2251799813685248, 2),
])
def test_partition_of(internal_id: int, partition: int) -> None:
    assert partition_of(internal_id) == partition


def test_partition_from_captured_frame() -> None:
    """tcp_07: partition 1's first internal id was 2**50 + 2."""
    (msg,) = FrameReader(MessageLayout(detail=True)).feed(
        load("youzan/tcp_07_sub_advanced_detail.txt").frames()[-1].data)
    assert isinstance(msg, MessageFrame)
    assert msg.internal_id == 2**50 + 2 and msg.partition == 1


def test_message_repr() -> None:
    (y,) = FrameReader().feed(encode_message(1, 1, youzan_message_id(3, 4), b"b" * 40))
    (c,) = FrameReader(CLASSIC_LAYOUT).feed(encode_message(1, 1, b"18a442095fa69000", b"b"))
    assert "internal_id=3" in repr(y) and "..." in repr(y)
    assert "18a442095fa69000" in repr(c)
    assert repr(HEARTBEAT) == "HEARTBEAT"
    assert repr(Response(b"OK")) == "Response(b'OK')"
    assert "E_X" in repr(ErrorFrame(b"E_X y"))


def test_frame_equality() -> None:
    assert Response(b"OK") == Response(b"OK") != Response(b"KO")
    assert ErrorFrame(b"E") == ErrorFrame(b"E") != Response(b"E")
    with pytest.raises(TypeError):
        hash(Response(b"OK"))


def test_custom_message_class() -> None:
    class Mine(MessageFrame):
        __slots__ = ()

    reader = FrameReader(MessageLayout(detail=True), message_class=Mine)
    (msg,) = reader.feed(load("youzan/tcp_07_sub_advanced_detail.txt").frames()[-1].data)
    assert type(msg) is Mine
    reader = FrameReader(message_class=Mine)
    (msg,) = reader.feed(encode_message(1, 1, bytes(16), b"x"))
    assert type(msg) is Mine


def test_trace_id_header_is_the_trace_id_not_a_header() -> None:
    """The real nsqd keeps ``##trace_id`` in a traced PUB_EXT message's ext header (captured
    in tests/fixtures/youzan/tcp_15_ext_topic.txt). It is already ``trace_id``; the internal
    key stays in ``ext`` (the bytes as stored) and out of ``headers``."""
    layout = MessageLayout.for_subscription(youzan=True, extend_support=True, command="SUB")
    ext = b'{"##trace_id": "12345", "k1": "v1"}'
    frame = encode_message(1, 1, youzan_message_id(2, 12345), b"b", layout, ext_version=4,
                           ext=ext)
    (msg,) = FrameReader(layout).feed(frame)
    assert isinstance(msg, MessageFrame)
    assert msg.trace_id == 12345 and msg.ext == ext
    assert msg.headers == {"k1": "v1"}
