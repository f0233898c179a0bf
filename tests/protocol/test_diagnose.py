"""Errors that diagnose a wrong address (sans-I/O part). What answered is
named with the usual port; an answer is never dumped, at most its first line, cut."""

from __future__ import annotations

import json

import pytest

from smartnsq.errors import HttpError, LookupdError, NotHttp, ProtocolError
from smartnsq.protocol.compression import split_first_frame
from smartnsq.protocol.diagnose import LINE, describe_start, first_line, lookupd_hint
from smartnsq.protocol.frames import FrameReader
from smartnsq.protocol.http import ResponseParser
from smartnsq.protocol.lookup import parse_lookup

PAGE = (b"<!DOCTYPE html>\r\n<html>\r\n<head><title>Welcome to nginx!</title></head>\r\n"
        + b"<body>" + b"x" * 5000 + b"</body>\r\n</html>\r\n")
BAD_PROTOCOL = (len(b"E_BAD_PROTOCOL bad magic") + 4).to_bytes(4, "big") \
    + (1).to_bytes(4, "big") + b"E_BAD_PROTOCOL bad magic"


def http(status: int, body: bytes, content_type: str = "text/html") -> bytes:
    return (f"HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def test_first_line_is_cut() -> None:
    assert first_line(b"\r\n  hello  \r\nworld") == "hello"
    long = first_line(b"y" * 500)
    assert len(long) == LINE and long.endswith("...")


def test_an_nsq_frame_where_http_was_expected_names_nsqds_tcp_port() -> None:
    parser = ResponseParser(max_body=1 << 20)
    with pytest.raises(NotHttp) as info:
        parser.feed(BAD_PROTOCOL)  # at once, not when the peer closes
    text = lookupd_hint(info.value.found)
    assert "E_BAD_PROTOCOL" in text and "4150" in text and "4161" in text


@pytest.mark.parametrize("cut", [1, 4, 7])
def test_an_nsq_frame_written_in_pieces_is_still_named(cut: int) -> None:
    """The real nsqd 1.3.0 writes an error frame's size and the rest apart: four bytes of
    size alone are no verdict yet ("binary data (00 00 00 20)"); the frame, once whole
    enough, is named as such; a peer that closes after part of a header gets the bytes
    named."""
    parser = ResponseParser(max_body=1 << 20)
    assert parser.feed(BAD_PROTOCOL[:cut]) is None
    with pytest.raises(NotHttp) as info:
        parser.feed(BAD_PROTOCOL[cut:])
    assert "4150" in lookupd_hint(info.value.found) and "E_BAD_PROTOCOL" in info.value.found
    closed = ResponseParser(max_body=1 << 20)
    assert closed.feed(BAD_PROTOCOL[:cut]) is None
    with pytest.raises(NotHttp, match="binary data"):
        closed.feed_eof()


def test_a_close_mid_answer_says_what_began() -> None:
    parser = ResponseParser(max_body=1 << 20)
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-")
    with pytest.raises(HttpError, match=r"HTTP/1\.1 200 OK"):
        parser.feed_eof()


@pytest.mark.parametrize("status", [200, 404, 502])
def test_an_html_page_from_a_lookupd_address_is_named_not_dumped(status: int) -> None:
    with pytest.raises(ProtocolError if status < 500 else LookupdError) as info:
        parse_lookup("t", "w", status, PAGE.decode())
    text = str(info.value)
    assert "HTML page" in text
    assert ("4161" in text) is (status < 500)  # a 5xx page is a proxy's: lookupd may be back
    assert "\n" not in text and "xxxxxxxxxx" not in text and len(text) < 300


def test_nsqds_404_to_lookup_names_nsqds_http_port() -> None:
    body = json.dumps({"message": "NOT_FOUND"})
    with pytest.raises(LookupdError) as info:
        parse_lookup("t", "w", 404, body)
    assert "4151" in str(info.value) and "4161" in str(info.value)
    assert not info.value.retriable


def test_a_long_non_json_error_body_keeps_one_line() -> None:
    with pytest.raises(LookupdError) as info:
        parse_lookup("t", "w", 500, "upstream failed\n" + "trace line\n" * 100)
    assert "\n" not in str(info.value) and "trace line" not in str(info.value)


@pytest.mark.parametrize("reader", ["handshake", "stream"])
def test_http_where_nsq_frames_were_expected_names_nsqds_tcp_port(reader: str) -> None:
    data = http(400, PAGE)
    with pytest.raises(ProtocolError) as info:
        if reader == "handshake":
            split_first_frame(data)
        else:
            FrameReader().feed(data)
    text = str(info.value)
    assert "HTTP/1.1 400" in text and "4150" in text
    assert "\n" not in text and "nginx" not in text


def test_binary_garbage_is_shown_as_a_few_bytes() -> None:
    assert describe_start(b"\x00\x01\x02\xff" * 20).startswith("binary data (00 01 02 ff")


def test_a_request_that_got_no_answer_shows_no_status() -> None:
    """A lookupd that never answered has no HTTP status to show: its error names the
    address and why (it read "lookupd answered 0: ..."), and keeps status 0 for code."""
    from smartnsq.errors import LookupdRequestFailed

    error = LookupdRequestFailed("127.0.0.1:4161", "refused", "cannot connect: refused")
    assert str(error) == "127.0.0.1:4161: cannot connect: refused" and error.status == 0
    assert str(LookupdError(503, "busy")) == "lookupd answered 503: busy"
