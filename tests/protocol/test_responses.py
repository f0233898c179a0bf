"""Response payloads: the 30-byte traced-publish answer, IDENTIFY's and AUTH's JSON.

The expectations are what real servers answered in the captures (and the recorder's own
decodings in the ``## decoded`` notes), plus the worked example in docs/protocol.md §3.7.
"""

from __future__ import annotations

import itertools
import json
import struct

import pytest
from capture import Event, load, tcp_capture_names

from smartnsq.errors import ProtocolError
from smartnsq.protocol.frames import FrameReader, MessageFrame, MessageLayout, Response
from smartnsq.protocol.responses import (
    TRACED_RESPONSE_SIZE,
    IdentifyResponse,
    PublishReceipt,
    encode_publish_receipt,
    parse_auth_response,
    parse_identify_response,
    parse_publish_response,
)


def replies_to(prefix: bytes) -> list[tuple[str, Event, Event]]:
    """(capture, command, first reply) for every captured command starting with ``prefix``."""
    out = []
    for name in tcp_capture_names():
        for send, recvs in load(name).exchanges():
            if send.data.startswith(prefix) and recvs:
                out.append((name, send, recvs[0]))
    return out


def payload(event: Event) -> bytes:
    exp = event.expected
    assert exp is not None and exp.payload is not None
    return bytes(exp.payload)


# -- traced publish ------------------------------------------------------------------------

# (capture, command line, internal id, trace id, queue offset, raw size): from the captures'
# "## decoded" notes and, where there is none, read off the recorded bytes
TRACED = [
    ("youzan/tcp_04_pub_trace.txt", 5, 3, 0x0102030405060708, 41, 43),
    ("youzan/tcp_04_pub_trace.txt", 15, 4, 0, 84, 43),
    ("youzan/tcp_05_mpub.txt", 45, 7, 0, 199, 82),
    ("youzan/tcp_14_ordered_sub_ordered_consume.txt", 93, 5, 119, 117, 43),
    ("youzan/tcp_15_ext_topic.txt", 127, 2, 12345, 0, 76),
]


def test_every_traced_answer_in_the_captures_is_listed() -> None:
    found = set()
    for name, send, reply in replies_to(b""):
        exp = reply.expected
        if exp is not None and exp.kind == "RESPONSE" and len(payload(reply)) == 30:
            found.add((name, send.line))
    assert found == {(name, line) for name, line, *_ in TRACED}


@pytest.mark.parametrize(("name", "line", "internal_id", "trace_id", "offset", "raw_size"),
                         TRACED)
def test_captured_traced_publish(name: str, line: int, internal_id: int, trace_id: int,
                                 offset: int, raw_size: int) -> None:
    send, recvs = next((s, r) for s, r in load(name).exchanges() if s.line == line)
    assert send.data.split(b" ")[0] in (b"PUB_TRACE", b"MPUB_TRACE", b"PUB_EXT")
    (frame,) = FrameReader().feed(recvs[0].data)
    assert isinstance(frame, Response)
    receipt = parse_publish_response(frame.data)
    assert receipt == PublishReceipt(internal_id, trace_id, offset, raw_size)
    assert receipt.partition == 0
    assert encode_publish_receipt(receipt) == frame.data
    if send.data.startswith(b"PUB_TRACE"):  # the server echoes the trace id sent
        (tid,) = struct.unpack_from(">Q", send.data, send.data.index(b"\n") + 5)
        assert receipt.trace_id == tid


def test_traced_receipt_matches_the_delivered_message() -> None:
    """tcp_14: the PUB_TRACE receipt and the SUB_ORDERED frame describe the same message."""
    cap = load("youzan/tcp_14_ordered_sub_ordered_consume.txt")
    receipt = parse_publish_response(
        payload(next(r[0] for s, r in cap.exchanges() if s.data.startswith(b"PUB_TRACE"))))
    assert receipt is not None
    reader = FrameReader(MessageLayout(detail=True))
    messages = [m for e in cap.frames() for m in reader.feed(e.data) if isinstance(m, MessageFrame)]
    traced = next(m for m in messages if m.body == b"ordered-trace")
    assert (traced.internal_id, traced.trace_id, traced.queue_offset, traced.raw_size) == (
        receipt.internal_id, receipt.trace_id, receipt.queue_offset, receipt.raw_size)
    # consecutive offsets: next = previous offset + previous raw size (docs/protocol.md §10)
    for a, b in itertools.pairwise(messages):
        assert a.queue_offset is not None and a.raw_size is not None
        assert b.queue_offset == a.queue_offset + a.raw_size


def test_traced_publish_worked_example() -> None:
    """docs/protocol.md §3.7: partition 1 seq 42, trace 777, offset 8192, raw size 39."""
    frame = bytes.fromhex("00 00 00 22 00 00 00 00 4f 4b 00 04 00 00 00 00 00 2a"
                          "00 00 00 00 00 00 03 09 00 00 00 00 00 00 20 00 00 00 00 27")
    (resp,) = FrameReader().feed(frame)
    assert isinstance(resp, Response)
    receipt = parse_publish_response(resp.data)
    assert receipt == PublishReceipt((1 << 50) | 42, 777, 8192, 39)
    assert receipt.partition == 1
    assert TRACED_RESPONSE_SIZE == 30


def test_plain_ok_has_no_receipt() -> None:
    for _, _, reply in replies_to(b"PUB ") + replies_to(b"MPUB "):
        if payload(reply) == b"OK":
            assert parse_publish_response(payload(reply)) is None
    assert parse_publish_response(b"OK") is None


@pytest.mark.parametrize("data", [
    b"", b"O", b"OK" + bytes(27), b"OK" + bytes(29), b"KO" + bytes(28), b"CLOSE_WAIT",
    b'{"max_rdy_count":2500}',
])
def test_unexpected_publish_response(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_publish_response(data)


# -- IDENTIFY ------------------------------------------------------------------------------

IDENTIFY_REPLIES = [(n, s, r) for n, s, r in replies_to(b"IDENTIFY\n")
                    if r.expected is not None and r.expected.kind == "RESPONSE"]


def test_identify_replies_cover_both_flavours_and_plain_ok() -> None:
    flavours = {n.split("/")[0] for n, _, r in IDENTIFY_REPLIES if payload(r).startswith(b"{")}
    assert flavours == {"classic", "youzan"}
    assert any(payload(r) == b"OK" for _, _, r in IDENTIFY_REPLIES)


@pytest.mark.parametrize(("name", "send", "reply"), IDENTIFY_REPLIES,
                         ids=[str(r) for _, _, r in IDENTIFY_REPLIES])
def test_captured_identify_response(name: str, send: Event, reply: Event) -> None:
    data = payload(reply)
    resp = parse_identify_response(data)
    if data == b"OK":
        assert resp == IdentifyResponse()
        assert not resp.negotiated and resp.upgrades == 0
        return
    obj = json.loads(data)
    assert resp.negotiated
    assert resp.raw == obj
    for key, value in obj.items():
        if hasattr(resp, key):
            assert getattr(resp, key) == value, key
    assert resp.is_youzan == name.startswith("youzan/") == ("-HA." in obj["version"])
    assert resp.desired_tag == obj.get("desired_tag", "")
    asked = json.loads(send.data[13:])
    # one extra OK per upgrade the server agreed to, none for tls it cannot do (tcp_29)
    assert resp.upgrades == sum(bool(obj[k]) for k in ("tls_v1", "snappy", "deflate"))
    if asked.get("tls_v1") and not obj["tls_v1"]:
        assert resp.upgrades == 0


def test_identify_defaults_and_values() -> None:
    data = payload(next(r for n, _, r in IDENTIFY_REPLIES if n == "youzan/tcp_01_identify.txt"))
    resp = parse_identify_response(data)
    assert resp.version == "0.3.7-HA.1.13.0"
    assert (resp.max_rdy_count, resp.max_msg_timeout, resp.msg_timeout) == (2500, 900000, 60000)
    assert (resp.output_buffer_size, resp.output_buffer_timeout) == (100, 50)
    assert resp.deflate_level == 0 and resp.max_deflate_level == 6
    classic = parse_identify_response(payload(next(
        r for n, _, r in IDENTIFY_REPLIES
        if n == "classic/tcp_01_identify_feature_negotiation.txt")))
    assert classic.version == "1.3.0" and not classic.is_youzan and classic.deflate_level == 6
    tagged = parse_identify_response(b'{"version":"0.3.7-HA.1.13.0","desired_tag":"blue",'
                                     b'"tls_v1":true,"snappy":true}')
    assert tagged.desired_tag == "blue" and tagged.upgrades == 2
    assert parse_identify_response(b'{"desired_tag":null}').desired_tag == ""


@pytest.mark.parametrize("data", [
    b"{not json", b"[1,2]", b'"OK"', b"", b'{"max_rdy_count":"2500"}', b'{"msg_timeout":true}',
    b'{"max_rdy_count":1.5}',
])
def test_bad_identify_response(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_identify_response(data)


# -- AUTH ----------------------------------------------------------------------------------

def test_captured_auth_responses() -> None:
    answers = [payload(r) for _, _, r in replies_to(b"AUTH\n")
               if r.expected is not None and r.expected.kind == "RESPONSE"]
    assert len(answers) >= 2
    for data in answers:
        auth = parse_auth_response(data)
        obj = json.loads(data)
        assert (auth.identity, auth.identity_url, auth.permission_count) == (
            obj["identity"], obj["identity_url"], obj["permission_count"])
    assert parse_auth_response(answers[0]).identity == "x"
    assert parse_auth_response(answers[0]).permission_count == 1


@pytest.mark.parametrize("data", [
    b"OK", b"[]", b"{}", b'{"identity":"x"}', b'{"identity":"x","permission_count":"many"}',
    b'{"identity":"x","permission_count":null}',
])
def test_bad_auth_response(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_auth_response(data)


def test_auth_identity_url_optional() -> None:
    auth = parse_auth_response(b'{"identity":"me","permission_count":3}')
    assert (auth.identity, auth.identity_url, auth.permission_count) == ("me", "", 3)
