"""The sans-I/O reader of the client-to-server stream (smartnsq.devcluster.nsqd.reader), in
memory."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from smartnsq.devcluster.nsqd.reader import (
    CommandReader,
    Data,
    Event,
    Int32,
    Line,
    LineTooLong,
    Magic,
)
from smartnsq.protocol import commands


def events(reader: CommandReader) -> list[Event]:
    out = []
    while (event := reader.next_event()) is not None:
        out.append(event)
    return out


def lines(data: bytes, *, binary_ids: bool = True) -> list[list[bytes]]:
    reader = CommandReader(binary_ids=binary_ids, expect_magic=False)
    reader.feed(data)
    out = []
    for event in events(reader):
        assert isinstance(event, Line)
        out.append(event.params)
    return out


def test_magic_then_lines() -> None:
    reader = CommandReader()
    reader.feed(b"  V")
    assert reader.next_event() is None
    reader.feed(b"2NOP\nRDY 5\r\n")
    got = events(reader)
    assert isinstance(got[0], Magic) and got[0].ok
    assert [e.params for e in got[1:]] == [[b"NOP"], [b"RDY", b"5"]]  # type: ignore[union-attr]
    bad = CommandReader()
    bad.feed(b"  V1")
    magic = bad.next_event()
    assert isinstance(magic, Magic) and not magic.ok


def test_split_on_single_spaces_like_go() -> None:
    assert lines(b"PUB t  0\nSUB t c \n") == [[b"PUB", b"t", b"", b"0"], [b"SUB", b"t", b"c", b""]]


def test_bodies_are_read_only_when_asked() -> None:
    reader = CommandReader(expect_magic=False)
    reader.feed(commands.pub("t", b"hello", 0) + b"NOP\n")
    line = reader.next_event()
    assert isinstance(line, Line) and line.params == [b"PUB", b"t", b"0"]
    reader.expect_int32()
    size = reader.next_event()
    assert isinstance(size, Int32) and size.value == 5
    reader.expect_bytes(size.value)
    body = reader.next_event()
    assert isinstance(body, Data) and body.data == b"hello"
    nop = reader.next_event()
    assert isinstance(nop, Line) and nop.params == [b"NOP"]


def test_the_length_is_seen_before_the_body_arrives() -> None:
    reader = CommandReader(expect_magic=False)
    reader.feed(b"PUB t 0\n" + struct.pack(">i", 1 << 30))
    assert isinstance(reader.next_event(), Line)
    reader.expect_int32()
    size = reader.next_event()
    assert isinstance(size, Int32) and size.value == 1 << 30
    neg = CommandReader(expect_magic=False)
    neg.feed(b"PUB t\n" + struct.pack(">i", -7))
    neg.next_event()
    neg.expect_int32()
    assert neg.next_event().value == -7  # type: ignore[union-attr]


def test_fin_req_touch_ids_are_sliced_at_fixed_offsets() -> None:
    msg_id = b"\x00\x0a\x20\x0a" + b"\n" * 12  # newlines and spaces everywhere
    got = lines(commands.fin(msg_id) + commands.req(msg_id, 1500) + commands.touch(msg_id) +
                b"NOP\n")
    assert got == [[b"FIN", msg_id], [b"REQ", msg_id, b"1500"], [b"TOUCH", msg_id], [b"NOP"]]


def test_short_fin_and_touch_read_on_to_their_fixed_length() -> None:
    reader = CommandReader(expect_magic=False)
    reader.feed(b"FIN abc\n")
    assert reader.next_event() is None  # youzan reads on to 20 bytes and the next newline
    reader.feed(b"0123456789ab\n")
    fin = reader.next_event()
    assert isinstance(fin, Line) and fin.params == [b"FIN", b"abc\n0123456789ab"]
    reader.feed(b"TOUCH x\n")
    assert reader.next_event() is None
    reader.feed(b"y" * 15)
    touch = reader.next_event()
    assert isinstance(touch, Line) and touch.params == [b"TOUCH", b"x\n" + b"y" * 14]


def test_classic_splits_fin_like_any_line() -> None:
    assert lines(b"FIN 01234567\n", binary_ids=False) == [[b"FIN", b"01234567"]]
    assert lines(b"REQ 0123456789abcdef 10\n", binary_ids=False) == \
        [[b"REQ", b"0123456789abcdef", b"10"]]


def test_line_too_long_stops_the_reader() -> None:
    reader = CommandReader(expect_magic=False, max_line=16)
    reader.feed(b"X" * 17)
    assert isinstance(reader.next_event(), LineTooLong)
    reader.feed(b"\nNOP\n")
    assert reader.next_event() is None


def test_take_buffered_hands_back_the_unparsed_rest() -> None:
    reader = CommandReader(expect_magic=False)
    reader.feed(b"NOP\n\xff\x06compressed")
    assert isinstance(reader.next_event(), Line)
    assert reader.take_buffered() == b"\xff\x06compressed"
    reader.feed(b"RDY 1\n")
    assert isinstance(reader.next_event(), Line)


@given(st.lists(st.sampled_from([
    commands.nop(), commands.rdy(3), commands.fin(b"\n" * 16), commands.req(b" \n" * 8, 7),
    commands.touch(b"a\nb\n" * 4), commands.sub("t", "c", 1), b"CLS\r\n"]), max_size=12),
    st.integers(1, 7))
def test_any_split_of_the_stream_gives_the_same_lines(parts: list[bytes], step: int) -> None:
    data = b"".join(parts)
    whole = lines(data)
    reader = CommandReader(expect_magic=False)
    got = []
    for i in range(0, len(data), step):
        reader.feed(data[i:i + step])
        got.extend(e.params for e in events(reader))  # type: ignore[union-attr]
    assert got == whole and len(whole) == len(parts)
