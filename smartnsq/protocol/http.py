"""HTTP/1.1 for nsqd's and nsqlookupd's APIs, sans-I/O: h11's client connection driven, with
the client's bounds on it.

The library talks HTTP only to nsqlookupd (``/lookup``, ``/listlookup``) and to the admin
routes of nsqd and nsqlookupd: short GETs and POSTs answered with JSON. A general-purpose HTTP
client (httpx with HTTP/2, proxies, cookies and a CA bundle) costs a plain Producer or
Consumer 12-17 MiB of memory for that (``docs/performance.md``); h11 is the sans-I/O HTTP/1.1
state machine alone (the dev cluster's server runs on it too), so the one HTTP engine of the
project writes the requests and reads the answers here, and :mod:`smartnsq.transport.http` carries
the bytes over asyncio.

Every answer is bounded while it is read, never after: the status line and headers together
(``max_head``), the body (``max_body``, checked against a declared ``Content-Length`` before
any of it is read, a chunk's declared size, and the bytes themselves for chunked or
close-delimited bodies), each chunk-size line, and the number of headers and trailer lines.
Requests always ask for the identity encoding, so an answer announcing another one is refused
rather than inflated (a compressed answer could be a bomb). Bytes in, values out; no sockets,
no time.

What h11 costs against the hand-written parser it replaced (``bench/http_parse.py``: a
``/lookup`` request built and a real 1.2 KB lookupd answer read): a tracemalloc peak of 9.2 KB
instead of 4.8 KB per exchange, and 0.59 M instead of 0.17 M instructions (callgrind), i.e.
about 0.2 ms of CPU per lookupd request, which a Producer or Consumer makes once per poll
interval (60 s) per topic. Loading h11 adds 0.32 MB (tracemalloc) and 12 modules to a process
that uses lookupd or the admin API; a client given nsqd addresses loads neither.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

import h11

from ..errors import AnswerTooLarge, HttpError, InvalidArgument, NotHttp
from .diagnose import describe_start, first_line, looks_like_http
from .validate import ascii_int

__all__ = [
    "Response",
    "ResponseParser",
    "Url",
    "build_request",
    "parse_url",
]

MAX_HEAD: Final = 64 * 1024
"""Default bound of a status line and its headers together (nsqd's are a few hundred bytes)."""
MAX_HEADERS: Final = 100
_MAX_CHUNK_LINE: Final = 1024
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_FRAME_HEADER: Final = 8  # an NSQ frame's size and type: what says a frame answered


@dataclass(frozen=True)
class Url:
    """Where a request goes: ``scheme`` ``http`` or ``https``; ``host`` without brackets."""

    scheme: str
    host: str
    port: int
    target: str  # path and query, as sent on the request line

    @property
    def tls(self) -> bool:
        return self.scheme == "https"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if _DEFAULT_PORTS[self.scheme] == self.port else f"{host}:{self.port}"


def parse_url(url: str, params: Mapping[str, str] | None = None) -> Url:
    """``http(s)://host[:port][/path]`` (plus ``params`` as its query) split for a request.

    Only what the library builds is accepted: no user info, no fragment, no other scheme.
    """
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in _DEFAULT_PORTS:
        raise InvalidArgument("url", "must start with http:// or https://", url)
    authority, slash, path = rest.partition("/")
    target = slash + path if slash else "/"
    if "@" in authority or "#" in target or any(c in url for c in " \r\n\t"):
        raise InvalidArgument("url", "must be http(s)://host:port/path", url)
    if authority.startswith("["):
        host, bracket, tail = authority[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise InvalidArgument("url", "an IPv6 host goes in brackets: [::1]:4161", url)
        port_text = tail[1:] if tail else ""
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise InvalidArgument("url", "has no host", url)
    if port_text:
        number = ascii_int(port_text)
        if number is None or not 0 < number < 65536:
            raise InvalidArgument("url", "port must be in 1..65535", url)
        port = number
    else:
        port = _DEFAULT_PORTS[scheme]
    if params:
        target += ("&" if "?" in target else "?") + urlencode(params)
    return Url(scheme, host, port, target)


_BODYLESS: Final = ("GET", "HEAD", "DELETE", "OPTIONS")


def _request(method: str, url: Url, headers: Iterable[tuple[str, str]], body: bytes,
             absolute: bool) -> h11.Request:
    """The h11 event of a request, with ``Host`` and (for methods that carry a body)
    ``Content-Length`` set here; what h11 refuses (CR/LF in a value, ':' in a name) is an
    :class:`InvalidArgument` of ``headers``."""
    if not method.isalpha() or not method.isupper():
        raise InvalidArgument("method", "must be an upper-case HTTP method", method)
    target = f"{url.scheme}://{url.authority}{url.target}" if absolute else url.target
    fields = [("Host", url.authority), *headers]
    if body or method not in _BODYLESS:
        fields.append(("Content-Length", str(len(body))))
    try:
        return h11.Request(method=method, target=target, headers=fields)
    except h11.LocalProtocolError:
        bad = next((name for name, value in fields
                    if any(c in name or c in value for c in "\r\n") or ":" in name), "")
        raise InvalidArgument("headers", "a header may not hold CR, LF (or ':' in its name)",
                              bad) from None


def build_request(method: str, url: Url, headers: Iterable[tuple[str, str]] = (),
                  body: bytes = b"", *, absolute: bool = False) -> bytes:
    """The bytes of one request, written by h11. ``Host`` and ``Content-Length`` (for methods
    that carry a body) are set here; ``absolute`` writes the full URL on the request line (to
    a proxy). :class:`ResponseParser` built with the same arguments gives these bytes too,
    as :attr:`ResponseParser.request`, and reads the answer on the same h11 connection."""
    return ResponseParser(max_body=0, method=method, url=url, headers=headers, body=body,
                          absolute=absolute).request


@dataclass(frozen=True)
class Response:
    """One whole answer. Header names are lower-case; ``keep_alive`` says whether the
    connection may carry another request (HTTP/1.1, not ``Connection: close``, a framed
    body and nothing after it)."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    keep_alive: bool

    def header(self, name: str, default: str | None = None) -> str | None:
        """The last value of ``name`` (lower-case), or ``default``."""
        for key, value in reversed(self.headers):
            if key == name:
                return value
        return default


_HEAD, _BODY, _DONE = range(3)
_PROBE: Final = Url("http", "-", 80, "/")  # the request of a parser made without one


class ResponseParser:
    """One request and its answer on one h11 client connection; :meth:`feed` returns the
    answer once whole.

    h11 does the HTTP/1.1 (status line, headers, framing, chunks, interim answers); this adds
    the bounds h11 has not, as bytes arrive: the head is bounded by ``max_head`` (h11's
    incomplete-event limit), the body by ``max_body`` (a declared ``Content-Length`` before
    any of it is read, a chunk from its size line, and the bytes themselves), the header
    count, the chunk-size line and the trailer lines; and the rules of this client: identity
    encoding only (a compressed answer could be a bomb), no folded header lines, HTTP/1.0 or
    1.1 only. h11's own refusals are re-worded in the client's terms (:class:`HttpError`).

    The request is built from ``method``, ``url``, ``headers``, ``body`` (see
    :func:`build_request`) and is in :attr:`request`; without ``url`` a stand-in request of
    ``method`` is used (a HEAD answer has no body). Anything after the answer is kept in
    :attr:`leftover` (a well-behaved server sends nothing there, so a connection with leftover
    bytes is not reused). A breach or a malformed answer raises :class:`HttpError` and the
    parser must be dropped.
    """

    __slots__ = ("_body", "_close", "_conn", "_eof", "_head", "_max_body", "_max_head",
                 "_method", "_response", "_size", "_state", "leftover", "request")

    def __init__(self, *, max_body: int, max_head: int = MAX_HEAD, method: str = "GET",
                 url: Url | None = None, headers: Iterable[tuple[str, str]] = (),
                 body: bytes = b"", absolute: bool = False) -> None:
        self._max_body = max_body
        self._max_head = max_head
        self._method = method
        self._conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=max_head)
        event = _request(method, url or _PROBE, headers, body, absolute and url is not None)
        data = self._conn.send(event) or b""
        if body:
            data += self._conn.send(h11.Data(data=body)) or b""
        self.request = data + (self._conn.send(h11.EndOfMessage()) or b"")
        self._head = bytearray()  # the head's first bytes: for diagnosis and the fold check
        self._body: list[bytes] = []
        self._size = 0
        self._state = _HEAD
        self._response: h11.Response | None = None
        self._close = False
        self._eof = False
        self.leftover = b""

    @property
    def started(self) -> bool:
        """Some of the answer has arrived (a reused connection that fails before this may
        be retried: the server never saw the request, or dropped it unanswered)."""
        return bool(self._head) or self._state != _HEAD

    def feed(self, data: bytes) -> Response | None:
        if self._state == _DONE:
            self.leftover += data
            return None
        if not data:  # (h11 reads b"" as the peer's close)
            return None
        if self._state == _HEAD and not self._watch_head(data):
            return None  # not HTTP, and what it is not yet known: h11 is not given it
        self._conn.receive_data(data)
        return self._events()

    def feed_eof(self) -> Response:
        """The peer closed: the answer if a close-delimited body just ended, else an error."""
        if self._state != _DONE:
            self._eof = True
            if self._head and not looks_like_http(self._head):  # a cut frame header
                raise NotHttp(describe_start(self._head[:256]))
            self._conn.receive_data(b"")
            answer = self._events()
            if answer is not None:
                return answer
        return self._answer()

    # -- parts ----------------------------------------------------------------------------------

    def _watch_head(self, data: bytes) -> bool:
        """What h11 takes that this client does not: a start that is not HTTP (said at once,
        not when the peer closes), a whole head over ``max_head`` arriving in one piece, and
        folded header lines. False while the start is not HTTP and what it is still unsaid."""
        room = self._max_head + 4 - len(self._head)
        if room > 0:
            self._head += data[:room]
        if not looks_like_http(self._head):
            if len(self._head) < _FRAME_HEADER and self._head[0] == 0:
                return False  # perhaps an NSQ frame's size, its type still to come (nsqd
                # writes them apart): what it is can be said once the header is whole
            raise NotHttp(describe_start(self._head[:256]))
        end = self._head.find(b"\r\n\r\n")
        if end < 0 and len(self._head) > self._max_head:  # (h11 bounds only an unfinished one)
            raise HttpError(f"status line and headers over {self._max_head} bytes")
        head = self._head if end < 0 else self._head[:end]
        for fold in (b"\r\n ", b"\r\n\t"):
            at = head.find(fold)
            if at >= 0:
                line = bytes(head[at + 2:at + 62])
                raise HttpError(f"malformed header line {first_line(line, 60)!r}")
        return True

    def _events(self) -> Response | None:
        while True:
            try:
                event = self._conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._refusal(str(exc)) from None
            if event is h11.NEED_DATA:
                self._pending()
                return None
            if event is h11.PAUSED:  # bytes after the answer
                return None
            if isinstance(event, h11.InformationalResponse):  # 100 Continue: the real one follows
                self._head = bytearray(self._conn.trailing_data[0][:self._max_head + 4])
            elif isinstance(event, h11.Response):
                self._frame(event)
            elif isinstance(event, h11.Data):
                self._size += len(event.data)
                if self._size > self._max_body:
                    raise AnswerTooLarge(self._max_body)
                self._body.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if len(event.headers) > MAX_HEADERS:
                    raise HttpError(f"more than {MAX_HEADERS} trailer lines")
                self._state = _DONE
                self.leftover = self._conn.trailing_data[0]
                return self._answer()
            else:  # ConnectionClosed before a whole answer
                raise self._refusal("peer unexpectedly closed connection")

    def _frame(self, event: h11.Response) -> None:
        """The answer's head: the client's rules on it, and a declared length bounded."""
        if event.http_version not in (b"1.0", b"1.1"):
            raise HttpError(f"not an HTTP/1.x status line: {first_line(bytes(self._head), 60)!r}")
        if len(event.headers) > MAX_HEADERS:
            raise HttpError(f"more than {MAX_HEADERS} headers")
        self._response = event
        self._state = _BODY
        self._head.clear()
        values = {name: value for name, value in event.headers}
        connection = {t.strip().lower() for t in values.get(b"connection", b"").split(b",")}
        self._close = b"close" in connection or (event.http_version == b"1.0"
                                                 and b"keep-alive" not in connection)
        encoding = values.get(b"content-encoding", b"identity").decode("latin-1").lower()
        if encoding != "identity":
            raise HttpError(f"answer encoded {encoding!r}, though identity was asked for")
        if event.status_code in (204, 304) or self._method == "HEAD":
            return  # no body, whatever the headers say (h11 frames it so too)
        if b"transfer-encoding" not in values:
            declared = values.get(b"content-length")
            if declared is None:
                self._close = True  # delimited by the close
            elif int(declared) > self._max_body:
                raise AnswerTooLarge(self._max_body, int(declared))

    def _pending(self) -> None:
        """Bounds on what h11 holds unfinished in a chunked body: the chunk declared by the
        last size line (refused before its bytes come), the size line, the trailer lines."""
        if self._state != _BODY:
            return
        reader = getattr(self._conn, "_reader", None)  # h11 keeps the chunk's size there
        in_chunk = getattr(reader, "_bytes_in_chunk", 0)
        if isinstance(in_chunk, int) and self._size + in_chunk > self._max_body:
            raise AnswerTooLarge(self._max_body)
        held = self._conn.trailing_data[0]
        if not held:
            return
        if held.count(b"\r\n") > MAX_HEADERS:
            raise HttpError(f"more than {MAX_HEADERS} trailer lines")
        if b"\r\n" not in held and len(held) > _MAX_CHUNK_LINE \
                and getattr(reader, "_reading_trailer", False) is False \
                and not in_chunk:
            raise HttpError(f"chunk size line over {_MAX_CHUNK_LINE} bytes")

    def _refusal(self, reason: str) -> HttpError:
        """h11's refusal ``reason`` in this client's words."""
        head = bytes(self._head)
        if "closed" in reason.lower():
            if self._state == _HEAD and head:
                return HttpError("connection closed in the middle of its answer: "
                                 f"{describe_start(head[:256])}")
            where = "before its status line" if not self.started else \
                "in the middle of its answer"
            return HttpError(f"connection closed {where}")
        if "Receive buffer too long" in reason:
            if self._state == _HEAD:
                return HttpError(f"status line and headers over {self._max_head} bytes")
            return HttpError(f"chunk size line or trailer over {self._max_head} bytes")
        if "status line" in reason or "response line" in reason or "request line" in reason:
            return HttpError(f"not an HTTP/1.x status line: {first_line(head, 60)!r}")
        if "header line" in reason or "continuation line" in reason:
            return HttpError(f"malformed header line ({first_line(reason, 60)})")
        if "Content-Length" in reason:
            return HttpError(f"bad Content-Length ({reason})")
        if "Transfer-Encoding" in reason:
            return HttpError("transfer encoding is not chunked")
        if "chunk header" in reason:
            return HttpError(f"chunk size is not hex ({first_line(reason, 60)})")
        if "chunk footer" in reason:
            return HttpError("chunk not followed by CRLF")
        return HttpError(f"malformed answer: {first_line(reason, 60)}")

    def _answer(self) -> Response:
        event = self._response
        if event is None or self._state != _DONE:
            raise self._refusal("peer unexpectedly closed connection")
        headers = tuple((name.decode("latin-1"), value.decode("latin-1"))
                        for name, value in event.headers)
        keep = not self._close and not self._eof and not self.leftover
        return Response(event.status_code, event.reason.decode("latin-1"), headers,
                        b"".join(self._body), keep)
