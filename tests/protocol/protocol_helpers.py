"""Helpers shared by the protocol tests (test_commands, test_frames, test_properties).

An independent reading of captured client command bytes (``reencode``: rebuilt with our
encoders from the fields they carry) and the field-by-field check of decoded server frames
against the capture script's own decoding (``check_capture``). Kept here so that no test
module imports another.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from capture import Capture, ExpectedFrame

from smartnsq.protocol import commands
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.frames import (
    HEARTBEAT,
    ErrorFrame,
    Frame,
    MessageFrame,
    MessageLayout,
    Response,
)

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")

# -- an independent reading of captured client bytes ----------------------------------------


def _body(rest: bytes) -> bytes:
    (n,) = U32.unpack_from(rest)
    if len(rest) != 4 + n:
        raise Truncated
    return rest[4:]


class Truncated(Exception):
    """The recorder sent only a length prefix (the server refuses on the length alone)."""


def _partition(token: bytes) -> Any:
    text = token.decode()
    return int(text) if text.lstrip("-").isdigit() else text


def reencode(data: bytes) -> bytes:
    """Rebuild captured command bytes with our encoders from the fields they carry."""
    if data == b"  V2":
        return MAGIC_V2
    name = data[:data.find(b" ")] if data.find(b" ") >= 0 else data[:data.find(b"\n")]
    # FIN/REQ/TOUCH carry 16 raw id bytes at fixed offsets (docs/protocol.md §3.2)
    if name == b"FIN":
        assert data.endswith(b"\n")
        return commands.fin(data[4:-1])
    if name == b"TOUCH":
        return commands.touch(data[6:-1])
    if name == b"REQ":
        return commands.req(data[4:20], int(data[21:-1]))
    nl = data.index(b"\n")
    tokens = data[:nl].split(b" ")
    rest = data[nl + 1:]
    name = tokens[0]
    args = [t.decode() for t in tokens[1:]]
    if name == b"NOP":
        return commands.nop()
    if name == b"CLS":
        return commands.cls()
    if name == b"RDY":
        return commands.rdy(int(args[0]))
    if name == b"AUTH":
        return commands.auth(_body(rest))
    if name == b"SUB":
        return commands.sub(args[0], args[1], _partition(tokens[3]) if len(args) > 2 else None)
    if name == b"SUB_ORDERED":
        return commands.sub_ordered(args[0], args[1], _partition(tokens[3]))
    if name == b"SUB_ADVANCED":
        return commands.sub_advanced(args[0], args[1],
                                     _partition(tokens[3]) if len(args) > 2 else None)
    partition = _partition(tokens[2]) if len(tokens) > 2 else None
    if name == b"PUB":
        return commands.pub(args[0], _body(rest), partition)
    if name == b"DPUB":
        return commands.dpub(args[0], int(args[1]), _body(rest))
    if name == b"PUB_TRACE":
        body = _body(rest)
        return commands.pub_trace(args[0], body[8:], U64.unpack_from(body)[0], partition)
    if name in (b"MPUB", b"MPUB_TRACE"):
        body = _body(rest)
        (count,) = U32.unpack_from(body)
        items, pos = [], 4
        for _ in range(count):
            (n,) = U32.unpack_from(body, pos)
            items.append(body[pos + 4:pos + 4 + n])
            pos += 4 + n
        assert pos == len(body), "MPUB total must be exact"
        if name == b"MPUB":
            return commands.mpub(args[0], items, partition)
        return commands.mpub_trace(args[0], [(U64.unpack_from(i)[0], i[8:]) for i in items],
                                   partition)
    raise NotImplementedError(name)


# The connection state each capture's consumer had when its messages arrived:
# (youzan node, IDENTIFY extend_support, subscribe command), as the captures' SENDs show.
STATE = {
    "youzan/tcp_07_sub_advanced_detail.txt": (True, False, "SUB_ADVANCED"),
    "youzan/tcp_14_ordered_sub_ordered_consume.txt": (True, False, "SUB_ORDERED"),
    "youzan/tcp_15_ext_topic.txt": (True, True, "SUB"),
}


def layout_for(cap: Capture) -> MessageLayout:
    youzan, ext, command = STATE.get(cap.name, (cap.flavor == "youzan", False, "SUB"))
    return MessageLayout.for_subscription(youzan=youzan, extend_support=ext, command=command)


def assert_frame(frame: Frame, expected: ExpectedFrame, layout: MessageLayout) -> None:
    """Compare one decoded frame with the capture script's decoding, every field."""
    if expected.kind == "RESPONSE":
        if expected.payload == b"_heartbeat_":
            assert frame is HEARTBEAT
        else:
            assert isinstance(frame, Response) and frame.data == expected.payload
        return
    if expected.kind == "ERROR":
        assert isinstance(frame, ErrorFrame) and frame.payload == expected.payload
        return
    assert isinstance(frame, MessageFrame)
    f = expected.fields
    assert f is not None
    assert frame.timestamp == f["timestamp_ns"]
    assert frame.attempts == f["attempts"]
    assert frame.body == f["body"].encode()
    if layout.youzan:
        assert frame.youzan
        assert frame.id.hex() == f["msgid_16_hex"]
        assert frame.internal_id == f["internal_id_u64"]
        assert frame.trace_id == f["trace_id_u64"]
        assert frame.partition == (f["internal_id_u64"] >> 50) & 0x3FF
    else:
        assert not frame.youzan
        assert frame.id == f["msgid_ascii"].encode()
        assert frame.internal_id == int(f["msgid_ascii"], 16)
        assert frame.trace_id is None and frame.partition is None
    # the script printed ext/detail fields only where the connection had them
    assert ("ext_ver" in f) == layout.ext
    assert ("disk_offset_u64" in f) == layout.detail
    if layout.ext:
        assert frame.ext_version == f["ext_ver"]
        if f["ext_ver"]:
            assert frame.ext == f["ext_bytes"].encode()
            assert len(f["ext_bytes"].encode()) == f["ext_len"]
            stored = json.loads(f["ext_bytes"])
            stored.pop("##trace_id", None)  # it is frame.trace_id, not a header
            assert frame.headers == stored
        else:
            assert frame.ext is None and frame.headers == {}
    else:
        assert frame.ext_version == 0 and frame.ext is None
    if layout.detail:
        assert frame.queue_offset == f["disk_offset_u64"]
        assert frame.raw_size == f["raw_size_u32"]
    else:
        assert frame.queue_offset is None and frame.raw_size is None


def check_capture(cap: Capture, frames: list[Frame]) -> None:
    events = cap.frames()
    assert len(frames) == len(events)
    layout = layout_for(cap)
    for frame, event in zip(frames, events, strict=True):
        assert event.expected is not None
        assert_frame(frame, event.expected, layout)
