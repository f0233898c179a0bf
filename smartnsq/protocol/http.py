"""HTTP/1.1 for nsqd's and nsqlookupd's APIs, sans-I/O: requests built, answers parsed.

The library talks HTTP only to nsqlookupd (``/lookup``, ``/listlookup``) and to the admin
routes of nsqd and nsqlookupd: short GETs and POSTs answered with JSON. A general-purpose HTTP
client (httpx with HTTP/2, proxies, cookies and a CA bundle) costs a plain Producer or
Consumer 12-17 MiB of memory for that (``docs/performance.md``), so this module holds the
small part of HTTP/1.1 those exchanges need and :mod:`smartnsq.http` drives it over asyncio.

Every answer is bounded while it is read, never after: the status line and headers together
(``max_head``), the body (``max_body``, checked against a declared ``Content-Length`` before
any of it is read, and against the bytes themselves for chunked or close-delimited bodies),
each chunk-size line, and the number of headers. Requests always ask for the identity
encoding, so an answer announcing another one is refused rather than inflated (a compressed
answer could be a bomb). Bytes in, values out; no sockets, no time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode

from ..errors import InvalidArgument, ProtocolError
from .diagnose import describe_start, first_line, looks_like_http
from .validate import ascii_int

__all__ = [
    "AnswerTooLarge",
    "HttpError",
    "NotHttp",
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


class HttpError(ProtocolError):
    """The peer's answer is not HTTP/1.1 this client can read, or breaks a bound."""


class NotHttp(HttpError):
    """The peer answered with something that is not HTTP at all; ``found`` says what it looks
    like (``diagnose.describe_start``: an NSQ frame, an HTML page, some text...), never more
    than its first line."""

    def __init__(self, found: str) -> None:
        self.found = found
        super().__init__(f"not an HTTP/1.x status line: answered with {found}")


class AnswerTooLarge(HttpError):
    """The answer's body is over ``limit`` bytes: ``declared`` when its ``Content-Length``
    said so (nothing of it read), ``None`` when the bytes themselves went past it."""

    def __init__(self, limit: int, declared: int | None = None) -> None:
        self.limit = limit
        self.declared = declared
        if declared is not None:
            text = f"answer of {declared} bytes is over the limit of {limit} bytes"
        else:
            text = f"answer of more than {limit} bytes"
        super().__init__(text)


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


def build_request(method: str, url: Url, headers: Iterable[tuple[str, str]] = (),
                  body: bytes = b"", *, absolute: bool = False) -> bytes:
    """The bytes of one request. ``Host`` and ``Content-Length`` (for methods that carry a
    body) are set here; ``absolute`` writes the full URL on the request line (to a proxy)."""
    if not method.isalpha() or not method.isupper():
        raise InvalidArgument("method", "must be an upper-case HTTP method", method)
    target = f"{url.scheme}://{url.authority}{url.target}" if absolute else url.target
    lines = [f"{method} {target} HTTP/1.1", f"Host: {url.authority}"]
    for name, value in headers:
        if any(c in name or c in value for c in "\r\n") or ":" in name:
            raise InvalidArgument("headers", "a header may not hold CR, LF (or ':' in its "
                                  "name)", name)
        lines.append(f"{name}: {value}")
    if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


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


_HEAD, _FIXED, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class ResponseParser:
    """Parses one response fed in any pieces; :meth:`feed` returns it once whole.

    ``method`` is the request's (a HEAD answer has no body). Anything after the response is
    kept in :attr:`leftover` (a well-behaved server sends nothing there, so a connection with
    leftover bytes is not reused). Bounds are checked as bytes arrive; a breach or a
    malformed answer raises :class:`HttpError` and the parser must be dropped.
    """

    __slots__ = ("_body", "_buf", "_close", "_headers", "_left", "_max_body", "_max_head",
                 "_method", "_reason", "_state", "_status", "leftover")

    def __init__(self, *, max_body: int, max_head: int = MAX_HEAD, method: str = "GET") -> None:
        self._max_body = max_body
        self._max_head = max_head
        self._method = method
        self._buf = bytearray()
        self._body = bytearray()
        self._state = _HEAD
        self._status = 0
        self._reason = ""
        self._headers: tuple[tuple[str, str], ...] = ()
        self._close = False
        self._left = 0
        self.leftover = b""

    @property
    def started(self) -> bool:
        """Some of the answer has arrived (a reused connection that fails before this may
        be retried: the server never saw the request, or dropped it unanswered)."""
        return bool(self._buf) or self._state != _HEAD

    def feed(self, data: bytes) -> Response | None:
        if self._state == _DONE:
            self.leftover += data
            return None
        self._buf += data
        while True:
            state = self._state
            if state == _HEAD:
                if self._buf and not looks_like_http(self._buf):  # (at once: no wait)
                    raise NotHttp(describe_start(self._buf[:256]))
                if not self._head():
                    return None
            elif state == _FIXED:
                take = min(self._left, len(self._buf))
                self._body += self._buf[:take]
                del self._buf[:take]
                self._left -= take
                if self._left:
                    return None
                self._state = _DONE
            elif state == _CHUNK_SIZE:
                line = self._line(_MAX_CHUNK_LINE, "chunk size line")
                if line is None:
                    return None
                size_text = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpError(f"chunk size {bytes(size_text[:20])!r} is not hex") \
                        from None
                if size < 0:
                    raise HttpError("negative chunk size")
                if len(self._body) + size > self._max_body:
                    raise AnswerTooLarge(self._max_body)
                self._left = size
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_DATA:
                take = min(self._left, len(self._buf))
                self._body += self._buf[:take]
                del self._buf[:take]
                self._left -= take
                if self._left:
                    return None
                self._state = _CHUNK_END
            elif state == _CHUNK_END:
                if len(self._buf) < 2:
                    return None
                if self._buf[:2] != b"\r\n":
                    raise HttpError("chunk not followed by CRLF")
                del self._buf[:2]
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                line = self._line(self._max_head, "trailer")
                if line is None:
                    return None
                if not line:
                    self._state = _DONE
                self._left += 1  # counts trailer lines, bounded like headers
                if self._left > MAX_HEADERS:
                    raise HttpError(f"more than {MAX_HEADERS} trailer lines")
            elif state == _UNTIL_CLOSE:
                if len(self._body) + len(self._buf) > self._max_body:
                    raise AnswerTooLarge(self._max_body)
                self._body += self._buf
                self._buf.clear()
                return None
            else:  # _DONE
                self.leftover = bytes(self._buf)
                self._buf.clear()
                return self._response()

    def feed_eof(self) -> Response:
        """The peer closed: the answer if a close-delimited body just ended, else an error."""
        if self._state == _UNTIL_CLOSE:
            self._state = _DONE
            return self._response()
        if self._state == _DONE:
            return self._response()
        if self._state == _HEAD and self._buf:  # closed before a whole head: what it began
            raise HttpError("connection closed in the middle of its answer: "
                            f"{describe_start(self._buf[:256])}")
        where = "before its status line" if not self.started else "in the middle of its answer"
        raise HttpError(f"connection closed {where}")

    # -- parts ----------------------------------------------------------------------------------

    def _line(self, limit: int, what: str) -> bytes | None:
        end = self._buf.find(b"\r\n", 0, limit + 2)
        if end < 0:
            if len(self._buf) > limit:
                raise HttpError(f"{what} over {limit} bytes")
            return None
        line = bytes(self._buf[:end])
        del self._buf[:end + 2]
        return line

    def _head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n", 0, self._max_head + 4)
        if end < 0:
            if len(self._buf) > self._max_head:
                raise HttpError(f"status line and headers over {self._max_head} bytes")
            return False
        head = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[:end + 4]
        lines = head.split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        status = ascii_int(code)
        if version not in ("HTTP/1.1", "HTTP/1.0") or len(code) != 3 or status is None:
            raise HttpError(f"not an HTTP/1.x status line: {first_line(lines[0], 60)!r}")
        if len(lines) - 1 > MAX_HEADERS:
            raise HttpError(f"more than {MAX_HEADERS} headers")
        headers = []
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip() or line[0] in " \t":
                raise HttpError(f"malformed header line {first_line(line, 60)!r}")
            headers.append((name.lower(), value.strip(" \t")))
        if 100 <= status < 200:  # an interim answer (100 Continue): the real one follows
            return True
        self._status, self._reason, self._headers = status, reason, tuple(headers)
        self._frame(version)
        return True

    def _frame(self, version: str) -> None:
        """How the body is delimited, from the status and the headers."""
        values = dict(self._headers)
        connection = {t.strip().lower() for t in values.get("connection", "").split(",")}
        self._close = "close" in connection or (version == "HTTP/1.0"
                                                and "keep-alive" not in connection)
        encoding = values.get("content-encoding", "identity").lower()
        if encoding != "identity":
            raise HttpError(f"answer encoded {encoding!r}, though identity was asked for")
        if self._method == "HEAD" or self._status in (204, 304):
            self._state = _DONE
            return
        transfer = values.get("transfer-encoding")
        if transfer is not None:
            if transfer.lower() != "chunked":
                raise HttpError(f"transfer encoding {transfer!r} is not chunked")
            self._state = _CHUNK_SIZE
            return
        lengths = {v for k, v in self._headers if k == "content-length"}
        if lengths:
            (declared, *others) = lengths
            size = ascii_int(declared)
            if others or size is None:
                raise HttpError(f"bad Content-Length {sorted(lengths)!r}"[:100])
            if size > self._max_body:
                raise AnswerTooLarge(self._max_body, size)
            self._left = size
            self._state = _FIXED if size else _DONE
            return
        self._close = True
        self._state = _UNTIL_CLOSE

    def _response(self) -> Response:
        return Response(self._status, self._reason, self._headers, bytes(self._body),
                        not self._close and not self.leftover)
