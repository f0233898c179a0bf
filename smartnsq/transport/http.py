"""The library's one HTTP client: HTTP/1.1 over asyncio streams, for nsqlookupd and nsqd.

:mod:`smartnsq.discovery.lookupds` (discovery) and :mod:`smartnsq.admin` (administration) send their
requests here; the bytes are built and parsed by h11's connection state machine, driven
sans-I/O by :mod:`smartnsq.protocol.http` (one h11 connection per exchange, which carries the
request out and the answer in). This module is the asyncio shell around it. It is small on
purpose: the servers answer short GETs and POSTs with JSON, and a general client cost every
lookupd Producer or Consumer 12-17 MiB (``docs/performance.md``).

* **One deadline** (``timeout``) bounds a whole request: connect, TLS, send, the complete
  answer. A peer dripping one byte a second is cut off there; the TCP connect (and TLS
  handshake) has its own, shorter ``connect_timeout`` inside it.
* **Bounded answers**: ``max_body`` per request, the head by ``max_head``
  (:class:`~smartnsq.protocol.http.AnswerTooLarge` before the body is read when the length
  is declared).
* **https://** goes over TLS with the system's CA store (or ``tls_ca_file``), verifying the
  host name unless ``tls_verify`` is off. The context is made on the first https request.
* **Keep-alive** per host: a connection whose answer was cleanly framed is kept for
  ``keepalive`` seconds (at most ``max_idle`` per host); a GET that finds its kept
  connection closed by the server is sent once more on a new one, within the same deadline.
* **Proxies** only with ``trust_env``: ``HTTP_PROXY``/``NO_PROXY`` for http:// URLs
  (https:// URLs always connect directly).

Failures are typed: :class:`HttpTimeout` (a :class:`~smartnsq.errors.Timeout`),
:class:`HttpConnectError` (no connection), :class:`HttpTLSError` (the handshake or the
certificate failed), :class:`HttpClosed` (the peer dropped the connection mid-exchange), all
three :class:`~smartnsq.errors.ConnectionFailed`; :class:`~smartnsq.errors.HttpError`
(a :class:`~smartnsq.errors.ProtocolError`) for an answer that breaks HTTP or a bound. Each
message starts with the peer's ``host:port``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Mapping

from ..errors import (
    HttpClosed,
    HttpConnectError,
    HttpConnectTimeout,
    HttpTimeout,
    HttpTLSError,
    InvalidArgument,
)
from ..protocol.http import MAX_HEAD, Response, ResponseParser, Url, parse_url
from ..protocol.identify import USER_AGENT

__all__ = [
    "HttpClient",
    "tls_context",
]

log = logging.getLogger("smartnsq.http")

_READ = 64 * 1024
_Key = tuple[str, str, int]


def _outcome_read(task: asyncio.Task[object]) -> None:
    if not task.cancelled():
        task.exception()

def tls_context(ca_file: str | None = None, verify: bool = True) -> ssl.SSLContext:
    """A client context: the system CA store (or ``ca_file``), host names checked unless
    ``verify`` is off."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class _Conn:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing()

    def abort(self) -> None:
        self.writer.transport.abort()


class HttpClient:
    """Keep-alive HTTP/1.1 requests (see the module docstring); one per manager or admin.

    ``headers`` go on every request (besides ``Host``, ``User-Agent``, ``Accept-Encoding:
    identity`` and ``Content-Length``). Nothing is dialled at construction. Close it with
    :meth:`aclose` (or ``async with``); requests after that raise ``RuntimeError``.
    """

    def __init__(self, *, headers: Mapping[str, str] | None = None,
                 user_agent: str = USER_AGENT, connect_timeout: float | None = None,
                 tls_ca_file: str | None = None, tls_verify: bool = True,
                 keepalive: float = 30.0, max_idle: int = 8, max_head: int = MAX_HEAD,
                 trust_env: bool = False) -> None:
        if connect_timeout is not None and not connect_timeout > 0:
            raise InvalidArgument("connect_timeout", "must be > 0 seconds or None",
                                  connect_timeout)
        self._headers = [("User-Agent", user_agent), ("Accept-Encoding", "identity"),
                         *(headers or {}).items()]
        self._connect_timeout = connect_timeout
        self._tls_ca_file = tls_ca_file
        self._tls_verify = tls_verify
        self._tls: ssl.SSLContext | None = None
        self._keepalive = keepalive
        self._max_idle = max_idle
        self._max_head = max_head
        self._trust_env = trust_env
        self._proxies: dict[str, str] | None = None
        self._idle: dict[_Key, list[_Conn]] = {}
        self._busy: set[_Conn] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> HttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Drop every connection, kept or in use (a request on one fails with
        :class:`HttpClosed`). Nothing is waited for: HTTP needs no orderly close, and a peer
        that never acknowledges one must not hold this up."""
        self._closed = True
        conns = [c for idle in self._idle.values() for c in idle] + list(self._busy)
        self._idle.clear()
        for conn in conns:
            conn.abort()

    async def request(self, method: str, url: str, *, timeout: float, max_body: int,
                      params: Mapping[str, str] | None = None,
                      headers: Mapping[str, str] | None = None,
                      body: bytes = b"") -> Response:
        """The whole answer to one request, within ``timeout`` seconds and ``max_body``
        bytes of body."""
        if self._closed:
            raise RuntimeError("this HttpClient is closed")
        target = parse_url(url, params)
        proxy = self._proxy(target)
        fields = self._headers
        if headers:  # the request's own headers replace the client's of the same name
            names = {name.lower() for name in headers}
            fields = [f for f in fields if f[0].lower() not in names] + list(headers.items())
        absolute = proxy is not None

        def parser() -> ResponseParser:  # one h11 connection per attempt
            return ResponseParser(max_body=max_body, max_head=self._max_head, method=method,
                                  url=target, headers=fields, body=body, absolute=absolute)

        first = parser()  # a request h11 refuses is refused here, before any connection
        exchange = asyncio.get_running_loop().create_task(
            self._exchange(method, target, proxy or target, first, parser))
        # a caller cancelled as the exchange fails (a client closing while a lookupd refuses):
        # wait_for (3.10/3.11) then drops the failure unread, and asyncio reports "Task
        # exception was never retrieved"; it is the caller's to see or not, so mark it read
        exchange.add_done_callback(_outcome_read)
        try:
            return await asyncio.wait_for(exchange, timeout)
        except HttpTimeout:
            raise
        except asyncio.TimeoutError:
            raise HttpTimeout(target.authority,
                              f"no whole answer within {timeout:g}s (timeout)") from None

    async def _exchange(self, method: str, url: Url, peer: Url, parser: ResponseParser,
                        again: Callable[[], ResponseParser]) -> Response:
        key = (peer.scheme, peer.host, peer.port)
        conn = self._take(key)
        while True:
            reused = conn is not None
            if conn is None:
                conn = await self._connect(url, peer)
            self._busy.add(conn)
            keep = False
            try:
                response = await self._roundtrip(conn, parser, url)
                keep = response.keep_alive and not self._closed
                return response
            except HttpClosed:
                if reused and method == "GET" and not parser.started:
                    log.debug("kept connection to %s was closed; asking on a new one",
                              url.authority)
                    self._busy.discard(conn)
                    conn.abort()
                    conn = None
                    parser = again()
                    continue
                raise
            finally:
                if conn is not None:
                    self._busy.discard(conn)
                    if keep:
                        self._put(key, conn)
                    else:
                        conn.abort()

    async def _roundtrip(self, conn: _Conn, parser: ResponseParser, url: Url) -> Response:
        try:
            conn.writer.write(parser.request)
            await conn.writer.drain()
            while True:
                chunk = await conn.reader.read(_READ)
                if not chunk:
                    if not parser.started:
                        raise HttpClosed(url.authority, "connection closed before an answer")
                    return parser.feed_eof()
                response = parser.feed(chunk)
                if response is not None:
                    return response
        except ssl.SSLError as exc:
            raise HttpTLSError(url.authority, f"TLS failed: {exc.reason or exc}") from exc
        except OSError as exc:
            raise HttpClosed(url.authority, f"connection lost: {exc}") from exc

    async def _connect(self, url: Url, peer: Url) -> _Conn:
        context = self._tls_context() if peer.tls else None
        limit = self._connect_timeout
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(
                peer.host, peer.port, ssl=context,
                server_hostname=peer.host if context is not None else None,
                ssl_handshake_timeout=limit if context is not None else None), limit)
        except asyncio.TimeoutError:
            raise HttpConnectTimeout(url.authority,
                                     f"no connection within {limit:g}s (connect timeout)") from None
        except ssl.SSLCertVerificationError as exc:
            raise HttpTLSError(url.authority, f"certificate refused: {exc.verify_message} "
                                              f"({exc.reason})") from exc
        except ssl.SSLError as exc:
            raise HttpTLSError(url.authority, f"TLS failed: {exc.reason or exc}") from exc
        except OSError as exc:
            where = "" if peer is url else f" (through proxy {peer.authority})"
            raise HttpConnectError(url.authority, f"cannot connect{where}: {exc}") from exc
        log.debug("connected to %s", peer.authority)
        return _Conn(reader, writer)

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = tls_context(self._tls_ca_file, self._tls_verify)
        return self._tls

    def _take(self, key: _Key) -> _Conn | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle:
            conn = idle.pop()
            if conn.usable() and now - conn.idle_since < self._keepalive:
                return conn
            conn.abort()
        return None

    def _put(self, key: _Key, conn: _Conn) -> None:
        idle = self._idle.setdefault(key, [])
        if not conn.usable() or len(idle) >= self._max_idle:
            conn.abort()
            return
        conn.idle_since = asyncio.get_running_loop().time()
        idle.append(conn)

    def _proxy(self, url: Url) -> Url | None:
        """The proxy for an http:// URL when ``trust_env`` (``HTTP_PROXY``, ``NO_PROXY``)."""
        if not self._trust_env or url.tls:
            return None
        import urllib.request  # only for clients told to read the environment

        if self._proxies is None:
            self._proxies = urllib.request.getproxies_environment()
        proxy = self._proxies.get("http")
        if not proxy or urllib.request.proxy_bypass(url.host):
            return None
        if "://" not in proxy:
            proxy = f"http://{proxy}"
        target = parse_url(proxy)
        if target.tls:
            raise InvalidArgument("HTTP_PROXY", "an https:// proxy is not supported", proxy)
        return target
