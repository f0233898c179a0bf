"""Command encoders, byte for byte, against docs/protocol.md and what real clients sent to real
servers.

Every complete client command in the captures (tests/fixtures/*/tcp_*.txt) is parsed by a
small parser independent of smartnsq (protocol_helpers.reencode), rebuilt with our encoders
and compared byte for byte.
The captured commands a real server refused for a bad argument must be refused by our
encoders with ``InvalidArgument`` before any byte is built.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import pytest
from capture import Event, all_events, load
from protocol_helpers import U32, U64, Truncated, reencode

from smartnsq import StartPosition
from smartnsq.errors import InvalidArgument
from smartnsq.protocol import commands
from smartnsq.protocol import validate as v
from smartnsq.protocol.commands import MAGIC_V2
from smartnsq.protocol.identify import IdentifyOptions

# JSON bodies (IDENTIFY, PUB_EXT) are compared as JSON: the recorder put spaces after ':' and
# ',' where we send compact JSON; the framing around them is still compared byte for byte.
STRUCTURAL = (b"IDENTIFY", b"PUB_EXT")
NOT_A_COMMAND = {"bad magic '  V1'", "SUB_ORDER test_ordered och 0", "IDENTIFY {not json"}

# captured commands the real server refused because of an argument: (capture, line)
REFUSED_BY_SERVER = {
    ("classic/tcp_04_mpub.txt", 47),  # MPUB cl_topic (count=0)
    ("classic/tcp_12_err_bad_topic.txt", 39),  # PUB bad*name (body x)
    ("classic/tcp_12_err_bad_topic.txt", 82),  # SUB bad*name ch1
    ("classic/tcp_12_err_bad_topic.txt", 125),  # SUB cl_topic bad*chan
    ("classic/tcp_12_err_bad_topic.txt", 168),  # PUB <65 chars topic>
    ("classic/tcp_13_err_fin_failed_nonfatal.txt", 91),  # FIN 01234567
    ("classic/tcp_18_err_body_too_large.txt", 83),  # PUB cl_topic (size 0)
    ("youzan/tcp_04_pub_trace.txt", 24),  # PUB_TRACE test_p2r2 0
    ("youzan/tcp_11_err_invalid_topic_name.txt", 39),  # PUB bad*name 0
    ("youzan/tcp_11_err_invalid_topic_name.txt", 80),  # SUB bad*name ch 0
    ("youzan/tcp_11_err_invalid_topic_name.txt", 123),  # SUB test_p2r2 bad*ch 0
    ("youzan/tcp_11_err_invalid_topic_name.txt", 166),  # PUB test_p2r2 notanumber
}
# the recorder sent only the length prefix of an oversized body; checked explicitly below
TRUNCATED = {
    ("classic/tcp_18_err_body_too_large.txt", 40),  # PUB cl_topic + size 1048577 (body not sent)
    ("classic/tcp_18_err_body_too_large.txt", 126),  # MPUB total 5242881 > max-body-size
    ("classic/tcp_18_err_body_too_large.txt", 170),  # MPUB of one 1048577-byte message
}


def _command_sends() -> list[Event]:
    out = []
    for e in all_events():
        if e.direction != "send" or not e.nsq:
            continue
        if e.label in NOT_A_COMMAND or e.data.startswith(STRUCTURAL):
            continue
        out.append(e)
    return out


def _key(e: Event, table: set[tuple[str, int]]) -> bool:
    return (e.capture, e.line) in table


COMMAND_SENDS = _command_sends()


def test_captures_hold_every_command_we_encode() -> None:
    names = {e.data if e.data == MAGIC_V2 else e.data.split(b"\n")[0].split(b" ")[0]
             for e in COMMAND_SENDS}
    assert names >= {b"  V2", b"AUTH", b"SUB", b"SUB_ORDERED", b"SUB_ADVANCED", b"RDY", b"FIN",
                     b"REQ", b"TOUCH", b"NOP", b"CLS", b"PUB", b"MPUB", b"DPUB", b"PUB_TRACE",
                     b"MPUB_TRACE"}
    assert len(COMMAND_SENDS) > 150


@pytest.mark.parametrize("event", COMMAND_SENDS, ids=str)
def test_captured_command_reencodes_byte_exact(event: Event) -> None:
    if _key(event, TRUNCATED):
        with pytest.raises(Truncated):
            reencode(event.data)
        return
    if _key(event, REFUSED_BY_SERVER):
        with pytest.raises(InvalidArgument):
            reencode(event.data)
        return
    assert reencode(event.data) == event.data


def test_every_refused_capture_was_seen() -> None:
    seen = {(e.capture, e.line) for e in COMMAND_SENDS}
    assert seen >= REFUSED_BY_SERVER | TRUNCATED


@pytest.mark.parametrize("event", [e for e in all_events() if e.direction == "send" and e.nsq
                                   and e.data.startswith(b"IDENTIFY\n")
                                   and e.label != "IDENTIFY {not json"], ids=str)
def test_captured_identify_framing(event: Event) -> None:
    (n,) = U32.unpack_from(event.data, 9)
    assert len(event.data) == 13 + n
    sent = json.loads(event.data[13:])
    ours = commands.identify(sent)
    assert ours[:9] == b"IDENTIFY\n"
    (m,) = U32.unpack_from(ours, 9)
    assert len(ours) == 13 + m
    assert json.loads(ours[13:]) == sent
    assert b" " not in ours[13:]  # compact JSON


def test_identify_options_reproduce_the_captured_request() -> None:
    sent = json.loads(load("youzan/tcp_01_identify.txt").sends()[1].data[13:])
    opts = IdentifyOptions(client_id="rawpy", hostname="rawpy-host",
                           user_agent="rawproto.py/0.1", heartbeat_interval=30000,
                           msg_timeout=60000)
    ours = opts.to_json()
    assert {k: ours[k] for k in sent} == sent
    assert ours["deflate_level"] in range(1, 10)  # always explicit (docs/protocol.md §3.3)
    assert ours["extend_support"] is False
    ext = IdentifyOptions(client_id="rawpy", extend_support=True, desired_tag="blue",
                          ext_filter={"type": 1, "filter_ext_key": "k", "filter_data": "v"})
    data = ext.to_json()
    assert data["extend_support"] is True and data["desired_tag"] == "blue"
    assert data["ext_filter"]["type"] == 1


def test_identify_empty_object_exact() -> None:
    captured = next(e for e in load("classic/tcp_28_identify_twice_and_bad_values.txt").sends()
                    if e.label == "IDENTIFY {}")
    assert commands.identify({}) == captured.data == b"IDENTIFY\n\x00\x00\x00\x02{}"


@pytest.mark.parametrize("name", ["youzan/tcp_15_ext_topic.txt",
                                  "youzan/tcp_16_pub_ext_to_nonext_topic.txt"])
def test_captured_pub_ext_framing(name: str) -> None:
    event = next(e for e in load(name).sends() if e.data.startswith(b"PUB_EXT "))
    header, rest = event.data.split(b"\n", 1)
    topic, partition = header.split(b" ")[1].decode(), int(header.split(b" ")[2])
    (total,) = U32.unpack_from(rest)
    (j,) = struct.unpack_from(">H", rest, 4)
    assert total == len(rest) - 4
    captured_json, body = rest[6:6 + j], rest[6 + j:]
    headers = json.loads(captured_json)
    ours = commands.pub_ext(topic, body, headers, partition)
    ext = json.dumps(headers, separators=(",", ":")).encode()
    assert ours == (header + b"\n" + U32.pack(2 + len(ext) + len(body))
                    + struct.pack(">H", len(ext)) + ext + body)


# -- worked examples in docs/protocol.md ----------------------------------------------------

def test_pub_trace_worked_example() -> None:
    """docs/protocol.md §3.7: PUB_TRACE orders 1, trace id 777, body hello."""
    expected = bytes.fromhex(
        "50 55 42 5f 54 52 41 43 45 20 6f 72 64 65 72 73 20 31 0a"
        "00 00 00 0d" "00 00 00 00 00 00 03 09" "68 65 6c 6c 6f")
    assert commands.pub_trace("orders", b"hello", 777, 1) == expected


def test_fin_worked_example() -> None:
    """docs/protocol.md §3.2: FIN for internal id (1 << 50) | 42 and trace id 12345."""
    msg_id = U64.pack((1 << 50) | 42) + U64.pack(12345)
    assert commands.fin(msg_id) == bytes.fromhex(
        "46 49 4e 20 00 04 00 00 00 00 00 2a 00 00 00 00 00 00 30 39 0a")


# -- every command, by hand ------------------------------------------------------------------

RAW_ID = b"\x00\x04\x00\x00\x00\x00\x00\x2a\n \x00\x00\x00\x00\x30\x39"  # \n and space inside


@pytest.mark.parametrize(("built", "expected"), [
    (MAGIC_V2, b"  V2"),
    (commands.auth("s3cret"), b"AUTH\n\x00\x00\x00\x06s3cret"),
    (commands.auth(b"\x00\xff"), b"AUTH\n\x00\x00\x00\x02\x00\xff"),
    (commands.sub("t", "c"), b"SUB t c\n"),
    (commands.sub("t", "c", 0), b"SUB t c 0\n"),
    (commands.sub("t", "c", 1023), b"SUB t c 1023\n"),
    (commands.sub("t.x-y_z", "c#ephemeral", 7), b"SUB t.x-y_z c#ephemeral 7\n"),
    (commands.sub_ordered("t", "c", 3), b"SUB_ORDERED t c 3\n"),
    (commands.sub_advanced("t", "c"), b"SUB_ADVANCED t c\n"),
    (commands.sub_advanced("t", "c", 2), b"SUB_ADVANCED t c 2\n"),
    (commands.sub_advanced("t", "c", None, StartPosition.timestamp(1700000000)),
     b"SUB_ADVANCED t c -1 timestamp:1700000000\n"),
    (commands.sub_advanced("t", "c", 1, StartPosition.queue_offset(4096)),
     b"SUB_ADVANCED t c 1 virtual_queue:4096\n"),
    (commands.sub_advanced("t", "c", 1, StartPosition.message_count(10)),
     b"SUB_ADVANCED t c 1 msgcount:10\n"),
    (commands.sub_advanced("t", "c", 0, StartPosition.end()),
     b"SUB_ADVANCED t c 0 special:-1\n"),
    (commands.rdy(0), b"RDY 0\n"),
    (commands.rdy(2500), b"RDY 2500\n"),
    (commands.fin(RAW_ID), b"FIN " + RAW_ID + b"\n"),
    (commands.req(RAW_ID), b"REQ " + RAW_ID + b" 0\n"),
    (commands.req(RAW_ID, 90000), b"REQ " + RAW_ID + b" 90000\n"),
    (commands.touch(RAW_ID), b"TOUCH " + RAW_ID + b"\n"),
    (commands.fin(bytearray(RAW_ID)), b"FIN " + RAW_ID + b"\n"),  # type: ignore[arg-type]
    (commands.nop(), b"NOP\n"),
    (commands.cls(), b"CLS\n"),
    (commands.pub("t", b"hi"), b"PUB t\n\x00\x00\x00\x02hi"),
    (commands.pub("t", b"hi", 4), b"PUB t 4\n\x00\x00\x00\x02hi"),
    (commands.mpub("t", [b"a", b"bc"]),
     b"MPUB t\n\x00\x00\x00\x0f\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"),
    (commands.mpub("t", iter([b"a"]), 9),
     b"MPUB t 9\n\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00\x00\x01a"),
    (commands.dpub("t", 1500, b"x"), b"DPUB t 1500\n\x00\x00\x00\x01x"),
    (commands.dpub("t", 0, b"x"), b"DPUB t 0\n\x00\x00\x00\x01x"),
    (commands.pub_trace("t", b"x", 0), b"PUB_TRACE t\n\x00\x00\x00\x09" + bytes(8) + b"x"),
    (commands.pub_trace("t", b"x", 2**64 - 1, 0),
     b"PUB_TRACE t 0\n\x00\x00\x00\x09" + b"\xff" * 8 + b"x"),
    (commands.mpub_trace("t", [(1, b"a"), (2, b"bc")], 1),
     b"MPUB_TRACE t 1\n\x00\x00\x00\x1f\x00\x00\x00\x02"
     b"\x00\x00\x00\x09" + U64.pack(1) + b"a" + b"\x00\x00\x00\x0a" + U64.pack(2) + b"bc"),
    (commands.pub_ext("t", b"b", {"k": "v"}), b'PUB_EXT t\n\x00\x00\x00\x0c\x00\x09{"k":"v"}b'),
    (commands.pub_ext("t", b"b", None, 2), b"PUB_EXT t 2\n\x00\x00\x00\x05\x00\x02{}b"),
    (commands.pub_ext("t", b"b", {}), b"PUB_EXT t\n\x00\x00\x00\x05\x00\x02{}b"),
    (commands.pub_ext("t", b"b", {"##trace_id": "12345"}),
     b'PUB_EXT t\n\x00\x00\x00\x19\x00\x16{"##trace_id":"12345"}b'),
    (commands.mpub_ext("t", [({"a": "1"}, b"x"), (None, b"yz")]),
     b"MPUB_EXT t\n\x00\x00\x00\x1e\x00\x00\x00\x02"
     b'\x00\x00\x00\x0c\x00\x09{"a":"1"}x' b"\x00\x00\x00\x06\x00\x02{}yz"),
    (commands.mpub_ext("t", [({"a": "1"}, b"x")], 0),
     b'MPUB_EXT t 0\n\x00\x00\x00\x14\x00\x00\x00\x01\x00\x00\x00\x0c\x00\x09{"a":"1"}x'),
])
def test_encoder_bytes(built: bytes, expected: bytes) -> None:
    assert built == expected


def test_id_commands_have_exactly_one_space_and_fixed_length() -> None:
    assert len(commands.fin(RAW_ID)) == 21
    assert len(commands.touch(RAW_ID)) == 23
    req = commands.req(RAW_ID, 5)
    assert req[4:20] == RAW_ID and req[20:21] == b" " and req[21:] == b"5\n"
    for line in (commands.sub("t", "c", 1), commands.pub("t", b"x", 1)[:8]):
        assert b"  " not in line and not line.split(b"\n")[0].endswith(b" ")


def test_mpub_total_is_exact() -> None:
    data = commands.mpub("t", [b"x" * 10] * 100)
    (total, count) = struct.unpack_from(">II", data, len(b"MPUB t\n"))
    assert count == 100 and total == len(data) - len(b"MPUB t\n") - 4


def test_unicode_ext_header_value() -> None:
    data = commands.pub_ext("t", b"b", {"k": "é"})
    assert '{"k":"é"}'.encode() in data


def test_command_name() -> None:
    assert commands.command_name(commands.sub("t", "c")) == "SUB"
    assert commands.command_name(commands.nop()) == "NOP"
    assert commands.command_name(commands.fin(RAW_ID)) == "FIN"
    assert commands.command_name(commands.identify({})) == "IDENTIFY"
    assert commands.command_name(commands.mpub_trace("t", [(1, b"a")])) == "MPUB_TRACE"


# -- refusals: InvalidArgument names the field, before anything is built ----------------------

BIG = (1 << 20) + 1
Case = tuple[Callable[[], object], str]

INVALID: list[Case] = [
    (lambda: commands.sub("", "c"), "topic"),
    (lambda: commands.sub("t" * 65, "c"), "topic"),
    (lambda: commands.sub("bad*name", "c"), "topic"),
    (lambda: commands.sub("a b", "c"), "topic"),
    (lambda: commands.sub("t#eph", "c"), "topic"),
    (lambda: commands.sub("t\n", "c"), "topic"),
    (lambda: commands.sub(b"t", "c"), "topic"),  # type: ignore[arg-type]
    (lambda: commands.sub("t", "bad*chan"), "channel"),
    (lambda: commands.sub("t", ""), "channel"),
    (lambda: commands.sub("t", "c" * 65), "channel"),
    (lambda: commands.sub("t", "c", -1), "partition"),
    (lambda: commands.sub("t", "c", 1024), "partition"),
    (lambda: commands.sub("t", "c", True), "partition"),
    (lambda: commands.sub("t", "c", "0"), "partition"),  # type: ignore[arg-type]
    (lambda: commands.sub_ordered("t", "c", 1.0), "partition"),  # type: ignore[arg-type]
    (lambda: commands.sub_ordered("t", "c", None), "partition"),  # type: ignore[arg-type]
    (lambda: commands.sub_ordered("t", "bad ch", 0), "channel"),
    (lambda: commands.sub_advanced("t*", "c"), "topic"),
    (lambda: commands.sub_advanced("t", "c", 2000), "partition"),
    (lambda: StartPosition("offset", 1), "start position"),  # type: ignore[arg-type]
    (lambda: StartPosition("special", 0), "start position"),
    (lambda: StartPosition.timestamp(-1), "start position timestamp"),
    (lambda: StartPosition.queue_offset(2**64), "start position virtual_queue"),
    (lambda: StartPosition.message_count(-5), "start position msgcount"),
    (lambda: commands.rdy(-1), "rdy"),
    (lambda: commands.rdy(True), "rdy"),
    (lambda: commands.rdy("1"), "rdy"),  # type: ignore[arg-type]
    (lambda: commands.fin(b"01234567"), "message id"),
    (lambda: commands.fin(b"x" * 17), "message id"),
    (lambda: commands.fin("0123456789abcdef"), "message id"),  # type: ignore[arg-type]
    (lambda: commands.touch(b""), "message id"),
    (lambda: commands.touch("0123456789abcdef"), "message id"),  # type: ignore[arg-type]
    (lambda: commands.req(b"x" * 15), "message id"),
    (lambda: commands.req("0123456789abcdef"), "message id"),  # type: ignore[arg-type]
    (lambda: commands.req(RAW_ID, -1), "requeue delay"),
    (lambda: commands.req(RAW_ID, 1.5), "requeue delay"),  # type: ignore[arg-type]
    (lambda: commands.req(RAW_ID, True), "requeue delay"),
    (lambda: commands.auth(b""), "auth secret"),
    (lambda: commands.pub("t", b""), "body"),
    (lambda: commands.pub("t", b"x" * BIG), "body"),
    (lambda: commands.pub("t", b"x" * 11, max_msg_size=10), "body"),
    (lambda: commands.pub("t", "text"), "body"),  # type: ignore[arg-type]
    (lambda: commands.pub("bad*name", b"x"), "topic"),
    (lambda: commands.pub("t", b"x", 1024), "partition"),
    (lambda: commands.pub("t", b"x", "notanumber"), "partition"),  # type: ignore[arg-type]
    (lambda: commands.mpub("t", []), "messages"),
    (lambda: commands.mpub("t", [b"x", b""]), "body"),
    (lambda: commands.mpub("t", [b"x" * BIG]), "body"),
    (lambda: commands.mpub("t", ["x"]), "body"),  # type: ignore[list-item]
    (lambda: commands.mpub("t", [b"x" * (1 << 20)] * 5 + [b"x" * 6]), "messages"),
    (lambda: commands.mpub("t", [b"x"] * 3, max_body_size=18), "messages"),
    (lambda: commands.mpub("t*", [b"x"]), "topic"),
    (lambda: commands.dpub("t", -1, b"x"), "delay"),
    (lambda: commands.dpub("t", True, b"x"), "delay"),
    (lambda: commands.dpub("t", 10, b""), "body"),
    (lambda: commands.dpub("t t", 10, b"x"), "topic"),
    (lambda: commands.pub_trace("t", b"", 1), "body"),
    (lambda: commands.pub_trace("t", b"x", -1), "trace_id"),
    (lambda: commands.pub_trace("t", b"x", 2**64), "trace_id"),
    (lambda: commands.pub_trace("t", b"x", True), "trace_id"),
    (lambda: commands.pub_trace("t", b"x", "1"), "trace_id"),  # type: ignore[arg-type]
    (lambda: commands.mpub_trace("t", []), "messages"),
    (lambda: commands.mpub_trace("t", [(1, b"x"), (-2, b"y")]), "trace_id"),
    (lambda: commands.mpub_trace("t", [(1, b"")]), "body"),
    (lambda: commands.pub_ext("t", b"", {"k": "v"}), "body"),
    (lambda: commands.pub_ext("t", b"x", {"a b": "v"}), "header name"),
    (lambda: commands.pub_ext("t", b"x", {"": "v"}), "header name"),
    (lambda: commands.pub_ext("t", b"x", {"k\n": "v"}), "header name"),
    (lambda: commands.pub_ext("t", b"x", {"é": "v"}), "header name"),
    (lambda: commands.pub_ext("t", b"x", {1: "v"}), "header name"),  # type: ignore[dict-item]
    (lambda: commands.pub_ext("t", b"x", {"k": 1}), "header 'k'"),  # type: ignore[dict-item]
    (lambda: commands.pub_ext("t", b"x", {"##trace_id": "abc"}), "header '##trace_id'"),
    (lambda: commands.pub_ext("t", b"x", {"##trace_id": "-1"}), "header '##trace_id'"),
    (lambda: commands.pub_ext("t", b"x", {"##trace_id": str(2**64)}), "header '##trace_id'"),
    (lambda: commands.pub_ext("t", b"x", [("k", "v")]), "headers"),  # type: ignore[arg-type]
    (lambda: commands.pub_ext("t", b"x", {"k": "v" * 70000}), "headers"),
    (lambda: commands.pub_ext("t", b"x", {"k": "\ud800"}), "headers"),
    (lambda: commands.identify({"ext_filter": {"type": object()}}), "IDENTIFY"),
    (lambda: commands.identify({"x": float("nan"), "y": {1j}}), "IDENTIFY"),
    (lambda: commands.mpub_ext("t", []), "messages"),
    (lambda: commands.mpub_ext("t", [({"k": "v"}, b"")]), "body"),
    (lambda: commands.mpub_ext("t", [({"k k": "v"}, b"x")]), "header name"),
    (lambda: IdentifyOptions(heartbeat_interval=500), "heartbeat_interval"),
    (lambda: IdentifyOptions(heartbeat_interval=60_001), "heartbeat_interval"),
    (lambda: IdentifyOptions(snappy=True, deflate=True), "compression"),
    (lambda: IdentifyOptions(deflate_level=0), "deflate_level"),
    (lambda: IdentifyOptions(deflate_level=10), "deflate_level"),
    (lambda: IdentifyOptions(msg_timeout=999), "msg_timeout"),
    (lambda: IdentifyOptions(msg_timeout=900_001), "msg_timeout"),
    (lambda: IdentifyOptions(sample_rate=100), "sample_rate"),
    (lambda: IdentifyOptions(output_buffer_size=63), "output_buffer_size"),
    (lambda: IdentifyOptions(output_buffer_timeout=5), "output_buffer_timeout"),
    (lambda: IdentifyOptions(desired_tag="x" * 101), "desired_tag"),
]


@pytest.mark.parametrize(("call", "field"), INVALID)
def test_invalid_argument(call: Callable[[], object], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        call()
    assert info.value.field == field
    assert info.value.rule
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_invalid_argument_message_is_bounded() -> None:
    with pytest.raises(InvalidArgument) as info:
        commands.pub("t", b"x" * BIG)
    assert len(str(info.value)) < 200


def test_truncated_captures_are_refused_at_their_declared_size() -> None:
    """tcp_18: the server refused on the length prefix; we refuse the same sizes."""
    with pytest.raises(InvalidArgument, match="max_msg_size"):
        commands.pub("cl_topic", bytes(1048577))
    with pytest.raises(InvalidArgument, match="max_body_size"):
        commands.mpub("cl_topic", [bytes(1 << 20)] * 5 + [bytes(9)])
    with pytest.raises(InvalidArgument, match="max_msg_size"):
        commands.mpub("cl_topic", [bytes(1048577)])
    assert len(commands.pub("cl_topic", bytes(v.DEFAULT_MAX_MSG_SIZE))) > v.DEFAULT_MAX_MSG_SIZE


def test_limits_are_inclusive() -> None:
    commands.sub("t" * 64, "c" * 64, 1023)
    commands.pub_trace("t", b"x", 2**64 - 1)
    commands.pub_ext("t", b"x", {"##trace_id": str(2**64 - 1)})
    commands.pub("t", b"x" * 10, max_msg_size=10)
    commands.mpub("t", [b"x"] * 3, max_body_size=4 + 3 * 5)
    IdentifyOptions(heartbeat_interval=-1, output_buffer_size=-1, output_buffer_timeout=-1,
                    deflate_level=9, msg_timeout=900_000, sample_rate=99,
                    desired_tag="x" * 100)


@pytest.mark.parametrize("tag", ["blue\n", "bad tag", "tag.1", "é", "x" * 101, "é" * 51])
def test_a_desired_tag_youzan_would_refuse_is_refused_before_sending(tag: str) -> None:
    with pytest.raises(InvalidArgument, match="desired_tag"):
        IdentifyOptions(desired_tag=tag)


@pytest.mark.parametrize("tag", ["", "blue", "A-z_09", "x" * 100])
def test_the_tags_youzan_accepts_are_accepted(tag: str) -> None:
    assert IdentifyOptions(desired_tag=tag).desired_tag == tag


def test_earliest_is_the_first_message() -> None:
    """``StartPosition.earliest()``: what ``--from earliest`` means, a message count of 0."""
    assert StartPosition.earliest() == StartPosition.message_count(0)
    assert StartPosition.earliest().token() == b"msgcount:0"


def test_a_memoryview_body_is_measured_in_bytes() -> None:
    """A view of 4-byte items is four times its ``len()``: the size checked is what goes on the
    wire, so the server's max_msg_size refusal is caught before sending."""
    from array import array

    from smartnsq.protocol import validate

    view = memoryview(array("i", [0]) * 300)  # 300 items, 1,200 bytes
    with pytest.raises(InvalidArgument, match="size 1200 exceeds max_msg_size 1000"):
        validate.check_body(view, 1000)  # type: ignore[arg-type]
    assert validate.check_body(view, 1200) == bytes(view)  # type: ignore[arg-type]
