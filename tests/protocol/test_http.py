"""HTTP/1.1 messages (smartnsq.protocol.http): requests built, answers parsed within bounds.

The answers of real nsqd and nsqlookupd (the captures in tests/fixtures) must parse however
they are cut; everything else here is what a hostile or broken peer can send.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import http_capture

from smartnsq.errors import AnswerTooLarge, HttpError, InvalidArgument, ProtocolError
from smartnsq.protocol.http import Response, ResponseParser, build_request, parse_url

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("*/http_*.txt"))


def parse(data: bytes, step: int = 0, **options: int | str) -> Response:
    """Feed ``data`` whole (``step`` 0) or ``step`` bytes at a time; the answer or a failure."""
    limits: dict[str, int | str] = {"max_body": 1 << 20, **options}
    parser = ResponseParser(**limits)  # type: ignore[arg-type]
    pieces = [data] if not step else [data[i:i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        answer = parser.feed(piece)
        if answer is not None:
            return answer
    return parser.feed_eof()


def wire(capture: str) -> bytes:
    """A capture as the server sent it: CRLF lines; a body curl de-chunked is chunked again."""
    lines = (FIXTURES / capture).read_bytes().split(b"\n")
    i = 0
    while not lines[i].startswith(b"HTTP"):
        i += 1
    end = i
    while lines[end].strip():
        end += 1
    head = [line.rstrip(b"\r") for line in lines[i:end]]  # some captures keep the CRs
    if not head[0].startswith(b"HTTP/1."):  # a layout that wrote the status as "HTTP 200"
        head[0] = b"HTTP/1.1" + head[0][4:] + b" -"
    body = b"\n".join(lines[end + 1:])
    lengths = [int(h.split(b":")[1]) for h in head if h.lower().startswith(b"content-length")]
    if lengths:
        body = body[:lengths[0]]
    else:
        body = body.strip()
        body = b"".join(b"%x\r\n%s\r\n" % (len(body[n:n + 1000]), body[n:n + 1000])
                        for n in range(0, len(body), 1000)) + b"0\r\n\r\n"
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def test_every_http_capture_is_there() -> None:
    assert len(CAPTURES) > 50
    assert any("stats_json" in c for c in CAPTURES)  # chunked answers among them


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("step", [0, 1, 7])
def test_real_answers_parse_however_they_are_cut(capture: str, step: int) -> None:
    status, body = http_capture(capture)
    answer = parse(wire(capture), step, max_body=16 << 20)
    assert (answer.status, answer.body.strip()) == (status, body)
    closes = ("connection", "close") in answer.headers
    assert answer.keep_alive is not closes  # else the connection is reused
    assert answer.headers and all(name == name.lower() for name, _ in answer.headers)


def test_content_length_and_what_follows() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\n"
    parser = ResponseParser(max_body=100)
    answer = parser.feed(head + b"hello" + b"HTTP/1.1")
    assert answer is not None and answer.body == b"hello" and answer.reason == "OK"
    assert answer.header("x-a") == "2" and answer.header("missing") is None
    assert parser.leftover == b"HTTP/1.1" and not answer.keep_alive  # bytes nobody asked for


def test_chunked_with_extensions_and_trailers() -> None:
    data = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
            b"3;name=value\r\nabc\r\n0A\r\n0123456789\r\n0\r\nX-Trailer: t\r\n\r\n")
    for step in (0, 1, 2, 5):
        answer = parse(data, step)
        assert answer.body == b"abc0123456789" and answer.keep_alive


def test_a_close_delimited_body_ends_with_the_connection() -> None:
    answer = parse(b"HTTP/1.1 200 OK\r\n\r\nall of it", 3)
    assert answer.body == b"all of it" and not answer.keep_alive


@pytest.mark.parametrize(("head", "keep"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
    (b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n", True),
])
def test_keep_alive(head: bytes, keep: bool) -> None:
    assert parse(head).keep_alive is keep


def test_no_body_for_204_and_head_and_interim_answers_are_skipped() -> None:
    assert parse(b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n").body == b""
    assert parse(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n", method="HEAD").body == b""
    answer = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2"
                   b"\r\n\r\nok", 4)
    assert (answer.status, answer.body) == (201, b"ok")


def test_a_declared_length_over_the_limit_is_refused_before_the_body() -> None:
    parser = ResponseParser(max_body=1024)
    with pytest.raises(AnswerTooLarge) as info:
        parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 314572800\r\n\r\n")
    assert info.value.declared == 314572800 and info.value.limit == 1024
    assert "314572800 bytes" in str(info.value) and isinstance(info.value, ProtocolError)


@pytest.mark.parametrize("data", [
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"400\r\n" + b"x" * 1024
    + b"\r\n1\r\n",
    b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 1025,
])
def test_a_body_growing_over_the_limit_is_refused(data: bytes) -> None:
    with pytest.raises(AnswerTooLarge) as info:
        parse(data, 100, max_body=1024)
    assert info.value.declared is None


def test_a_huge_chunk_is_refused_from_its_size_line() -> None:
    parser = ResponseParser(max_body=1024)
    with pytest.raises(AnswerTooLarge):
        parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n")


@pytest.mark.parametrize(("data", "match"), [
    (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000, "headers over 65536 bytes"),
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 101 + b"\r\n", "more than 100 headers"),
    (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
    (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "malformed header"),
    (b"HTTP/1.1 200 OK\r\nX: a\r\n folded\r\n\r\n", "malformed header"),
    (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n", "encoded 'gzip'"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "not chunked"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
    # digits str.isdigit accepts but int() refuses (a bare ValueError before) or reads
    (b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 \xb2\xb2\xb2 OK\r\n\r\n", "status line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not hex"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "chunk size line"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxyz", "CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n" + b"T: x\r\n" * 101,
     "trailer"),
])
def test_broken_answers_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(HttpError, match=match):
        parse(data)


@pytest.mark.parametrize("data", [
    b"", b"HTTP/1.1 200 OK\r\nContent-Le", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
])
def test_a_connection_closed_early_is_an_error(data: bytes) -> None:
    parser = ResponseParser(max_body=100)
    parser.feed(data)
    assert parser.started is bool(data)
    with pytest.raises(HttpError, match="connection closed"):
        parser.feed_eof()


# -- requests ------------------------------------------------------------------------------------

def test_a_get_with_params() -> None:
    url = parse_url("http://127.0.0.1:4161/lookup", {"topic": "a b&c", "access": "w"})
    assert build_request("GET", url, [("Accept", "application/vnd.nsq; version=1.0")]) == (
        b"GET /lookup?topic=a+b%26c&access=w HTTP/1.1\r\nHost: 127.0.0.1:4161\r\n"
        b"Accept: application/vnd.nsq; version=1.0\r\n\r\n")


def test_a_post_carries_its_length_even_empty() -> None:
    url = parse_url("https://[::1]:4443/channel/setoffset?topic=t")
    assert url.tls and url.host == "::1" and url.authority == "[::1]:4443"
    request = build_request("POST", url, body=b'{"timestamp":"1"}')
    assert request.startswith(b"POST /channel/setoffset?topic=t HTTP/1.1\r\nHost: [::1]:4443")
    assert request.endswith(b"Content-Length: 17\r\n\r\n{\"timestamp\":\"1\"}")
    assert b"Content-Length: 0\r\n" in build_request("POST", parse_url("http://h:1/x"))


def test_absolute_form_for_a_proxy_and_default_ports() -> None:
    url = parse_url("http://lookupd.example/ping")
    assert (url.port, url.authority) == (80, "lookupd.example")
    assert build_request("GET", url, absolute=True).startswith(
        b"GET http://lookupd.example/ping HTTP/1.1\r\n")
    assert parse_url("https://h").port == 443 and parse_url("https://h").target == "/"


@pytest.mark.parametrize("url", ["ftp://h:1/", "h:1/x", "http://user@h:1/", "http://h:0/",
                                 "http://h:99999/", "http://[::1/", "http://:1/", "http://h/a b",
                                 "http://h:1/x#frag", "http://h:x/", "http://h:\u00b2/",
                                 "http://h:\u0663/"])
def test_urls_the_library_never_builds_are_refused(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_url(url)
    assert info.value.field == "url"


@pytest.mark.parametrize(("method", "headers"), [
    ("get", []), ("GET /x", []), ("GET", [("X", "a\r\nInjected: 1")]), ("GET", [("X:Y", "1")]),
])
def test_no_request_smuggling(method: str, headers: list[tuple[str, str]]) -> None:
    with pytest.raises(InvalidArgument):
        build_request(method, parse_url("http://h:1/"), headers)


def test_the_parser_carries_its_request_on_the_same_h11_connection() -> None:
    url = parse_url("http://h:1/stats", {"format": "json"})
    parser = ResponseParser(max_body=100, method="HEAD", url=url, headers=[("X", "1")])
    assert parser.request == build_request("HEAD", url, [("X", "1")])
    answer = parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
    assert answer is not None and answer.body == b"" and answer.keep_alive


def test_a_whole_head_over_the_bound_is_refused_even_in_one_piece() -> None:
    data = b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\nContent-Length: 0\r\n\r\n"
    with pytest.raises(HttpError, match="headers over 65536 bytes"):
        ResponseParser(max_body=100).feed(data)
