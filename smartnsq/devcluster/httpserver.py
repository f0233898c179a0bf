"""A small HTTP/1.1 server on asyncio for the dev cluster's nsqlookupd and nsqd HTTP APIs.

Real NSQ servers render the same handler result three ways (docs/protocol.md §2.1, YS
``internal/http_api/api_response.go``), and clients depend on the differences, so the rendering
is chosen per route instead of per handler:

* ``NEGOTIATE`` (youzan read endpoints): with ``Accept: application/vnd.nsq; version=1.0`` the
  bare data, the real status, errors as ``{"message": ...}`` and ``X-Nsq-Content-Type``;
  without it ``{"status_code":200,"status_txt":"OK","data":...}`` and every error as HTTP 500
  ``{"status_code":500,"status_txt":"<TEXT>","data":null}``.
* ``V1`` (admin/write endpoints, and every route of a ``classic=True`` server, since classic
  1.3.0 never wraps): always bare, real status, ``X-Nsq-Content-Type`` always.
* ``PLAIN`` (``/ping``): the text as is, no NSQ header.

HTTP parsing and framing is h11's; query strings go through ``urllib.parse``: no byte is parsed
by hand here.

API (for nsqd and nsqlookupd implementations)::

    from smartnsq.devcluster.httpserver import HTTPServer, HTTPError, Request, Response, NEGOTIATE

    server = HTTPServer(host="127.0.0.1", port=0, classic=False, name="nsqd-1")

    async def pub(req: Request) -> object:
        topic = req.arg("topic")            # first value or "" (Go's url.Values.Get)
        if not topic:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        req.body                            # bytes, whole body
        return "OK"                         # str/bytes: raw body; dict/list: JSON; None: empty

    server.route("POST", "/pub", pub, NEGOTIATE)
    server.route(("GET", "POST"), "/stats", stats, NEGOTIATE)
    port = await server.start()             # binds (port=0: ephemeral); returns the bound port
    ...
    await server.stop()                     # closes the listener and every open connection

Handler results:

* ``None`` -> empty body (no Content-Type); wrapped form gives ``"data":null``.
* ``str`` / ``bytes`` -> raw body; Content-Type ``text/plain; charset=utf-8`` (what Go's
  content sniffing gives for text) unless empty.
* anything else -> JSON built with :func:`go_json` (compact, dict order kept: build dicts in
  the order Go would print them, i.e. struct field order, or sorted keys for Go maps).
* a :class:`Response` -> sent exactly as given (status, headers, body; ``chunked=True`` sends
  ``Transfer-Encoding: chunked`` like Go does for large/streamed bodies such as nsqd /stats).
* raise :class:`HTTPError(status, message)` -> the error rendering of the route's style.
  Other exceptions -> 500 ``INTERNAL_ERROR`` (V1 style), logged.

Unknown paths answer 404 ``{"message":"NOT_FOUND"}`` and a known path with another method
405 ``{"message":"METHOD_NOT_ALLOWED"}`` with an ``Allow`` header, both V1-rendered, as the
real servers do. Connections are kept alive (HTTP/1.1) until the client closes them or sends
``Connection: close``. ``server.pause()`` / ``server.resume()`` hold every request (new and
pending) without answering, a lookupd or nsqd that hangs; ``stop()`` makes the port refuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

import h11

__all__ = [
    "NEGOTIATE",
    "PLAIN",
    "V1",
    "V1_ACCEPT",
    "HTTPError",
    "HTTPServer",
    "Handler",
    "Request",
    "Response",
    "go_json",
]

log = logging.getLogger("smartnsq.devcluster.httpserver")

NEGOTIATE = "negotiate"
V1 = "v1"
PLAIN = "plain"

V1_ACCEPT = "application/vnd.nsq; version=1.0"
NSQ_CONTENT_TYPE = ("X-Nsq-Content-Type", "nsq; version=1.0")
JSON_TYPE = ("Content-Type", "application/json; charset=utf-8")
TEXT_TYPE = ("Content-Type", "text/plain; charset=utf-8")

MAX_BODY = 64 * 1024 * 1024  # far above nsqd's max-body-size; nsqd checks its own limits
_READ_SIZE = 65536

_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026",
                             "\u2028": "\\u2028", "\u2029": "\\u2029"})


def go_json(data: Any) -> bytes:
    """JSON as Go's ``json.Marshal`` prints it: compact, UTF-8, HTML characters escaped."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return text.translate(_GO_ESCAPES).encode()


class HTTPError(Exception):
    """An API error: its rendering depends on the route's style (see module doc)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Request:
    method: str
    target: str  # path and query as sent
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]  # lower-cased names; a repeated header keeps its last value
    header_list: list[tuple[str, str]]  # lower-cased names, every header in order
    body: bytes
    peer: tuple[str, int]

    def arg(self, name: str, default: str = "") -> str:
        """The first value of a query parameter (Go's ``url.Values.Get``)."""
        values = self.query.get(name)
        return values[0] if values else default

    def has_arg(self, name: str) -> bool:
        return name in self.query

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    @property
    def accepts_v1(self) -> bool:
        """The exact Accept value the real servers compare against."""
        return self.headers.get("accept") == V1_ACCEPT


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    chunked: bool = False


Handler = Callable[[Request], Awaitable[Any]]


@dataclass
class _Route:
    handler: Handler
    style: str


class HTTPServer:
    """One listening HTTP server (a lookupd's or an nsqd's HTTP port)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, classic: bool = False,
                 name: str = "http") -> None:
        self.host = host
        self.port = port
        self.classic = classic
        self.name = name
        self._routes: dict[str, dict[str, _Route]] = {}
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._running = asyncio.Event()
        self._running.set()

    # -- configuration -------------------------------------------------------------------------

    def route(self, methods: str | Iterable[str], path: str, handler: Handler,
              style: str = V1) -> None:
        if style not in (NEGOTIATE, V1, PLAIN):
            raise ValueError(f"unknown style {style!r}")
        names = [methods] if isinstance(methods, str) else list(methods)
        by_method = self._routes.setdefault(path, {})
        for method in names:
            by_method[method.upper()] = _Route(handler, style)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def started(self) -> bool:
        return self._server is not None

    async def start(self) -> int:
        if self._server is not None:
            return self.port
        self._server = await asyncio.start_server(self._serve, self.host, self.port,
                                                  reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        log.debug("%s listening on %s", self.name, self.address)
        return self.port

    async def stop(self) -> None:
        """Stop listening and drop every connection, as a killed process would."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        if self._conns:
            _, pending = await asyncio.wait(list(self._conns), timeout=1.0)
            for task in pending:  # a handler still running: it will see the closed socket
                task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)
        self._running.set()
        log.debug("%s stopped", self.name)

    def pause(self) -> None:
        """Hold every request unanswered until :meth:`resume` (connections stay open)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    # -- connection handling --------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self._writers.add(writer)
        peername = writer.get_extra_info("peername") or ("", 0)
        peer = (str(peername[0]), int(peername[1]))
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=64 * 1024)
        try:
            while True:
                request = await self._read_request(conn, reader, writer, peer)
                if request is None:
                    break
                await self._running.wait()
                response = await self._dispatch(request)
                self._send_response(conn, writer, request, response)
                await writer.drain()
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    break
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # a cancelled connection task ends quietly: asyncio's stream callback checks it
        except h11.RemoteProtocolError as exc:
            log.debug("%s: bad request from %s: %s", self.name, peer, exc)
            with contextlib.suppress(Exception):
                self._send_response(conn, writer, None,
                                    Response(exc.error_status_hint, b"", []))
                await writer.drain()
        finally:
            self._conns.discard(task)
            self._writers.discard(writer)
            writer.close()

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader,
                            writer: asyncio.StreamWriter, peer: tuple[str, int]
                            ) -> Request | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                if head is not None and conn.they_are_waiting_for_100_continue:
                    writer.write(conn.send(h11.InformationalResponse(status_code=100,
                                                                     headers=[])) or b"")
                data = await reader.read(_READ_SIZE)
                if not data and conn.their_state is h11.IDLE and head is None:
                    return None  # client closed between requests
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY:
                    raise ConnectionError("request body too large")
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                return self._build_request(head, bytes(body), peer)
            elif isinstance(event, h11.ConnectionClosed):
                return None

    @staticmethod
    def _build_request(head: h11.Request, body: bytes, peer: tuple[str, int]) -> Request:
        target = head.target.decode("latin-1")
        split = urlsplit(target)
        header_list = [(k.decode("latin-1").lower(), v.decode("latin-1"))
                       for k, v in head.headers]
        return Request(
            method=head.method.decode("ascii").upper(),
            target=target,
            path=split.path or "/",
            query=parse_qs(split.query, keep_blank_values=True),
            headers=dict(header_list),
            header_list=header_list,
            body=body,
            peer=peer,
        )

    # -- routing and rendering ------------------------------------------------------------------

    async def _dispatch(self, request: Request) -> Response:
        by_method = self._routes.get(request.path)
        if by_method is None:
            return self._render_error(V1, request, HTTPError(404, "NOT_FOUND"))
        route = by_method.get(request.method)
        if route is None:
            allowed = sorted(by_method)
            if self.classic:
                allowed = ["OPTIONS", *allowed]
            resp = self._render_error(V1, request, HTTPError(405, "METHOD_NOT_ALLOWED"))
            resp.headers.insert(0, ("Allow", ", ".join(allowed)))
            return resp
        style = V1 if self.classic and route.style == NEGOTIATE else route.style
        try:
            result = await route.handler(request)
        except HTTPError as exc:
            return self._render_error(style, request, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s: handler for %s %s failed", self.name, request.method,
                          request.path)
            return self._render_error(V1, request, HTTPError(500, "INTERNAL_ERROR"))
        if isinstance(result, Response):
            return result
        return self._render(style, request, result)

    @staticmethod
    def _raw(data: str | bytes) -> bytes:
        return data.encode() if isinstance(data, str) else data

    def _render(self, style: str, request: Request, data: Any) -> Response:
        if style == PLAIN:
            body = b"" if data is None else self._raw(data) if isinstance(
                data, str | bytes) else go_json(data)
            return Response(200, body, [TEXT_TYPE] if body else [])
        if style == NEGOTIATE and not request.accepts_v1:
            if isinstance(data, str | bytes):
                body = self._raw(data)
                return Response(200, body, [TEXT_TYPE] if body else [])
            wrapped = {"status_code": 200, "status_txt": "OK", "data": data}
            return Response(200, go_json(wrapped), [JSON_TYPE])
        # V1 rendering
        if data is None:
            return Response(200, b"", [NSQ_CONTENT_TYPE])
        if isinstance(data, str | bytes):
            body = self._raw(data)
            headers = [TEXT_TYPE] if body else []
            return Response(200, body, [*headers, NSQ_CONTENT_TYPE])
        return Response(200, go_json(data), [JSON_TYPE, NSQ_CONTENT_TYPE])

    def _render_error(self, style: str, request: Request, exc: HTTPError) -> Response:
        if style == PLAIN:
            body = exc.message.encode()
            return Response(exc.status, body, [TEXT_TYPE] if body else [])
        if style == NEGOTIATE and not request.accepts_v1:
            wrapped = {"status_code": 500, "status_txt": exc.message, "data": None}
            return Response(500, go_json(wrapped), [JSON_TYPE])
        body = b'{"message":' + go_json(exc.message) + b"}"
        return Response(exc.status, body, [JSON_TYPE, NSQ_CONTENT_TYPE])

    def _send_response(self, conn: h11.Connection, writer: asyncio.StreamWriter,
                       request: Request | None, response: Response) -> None:
        headers = list(response.headers)
        names = {k.lower() for k, _ in headers}
        if "date" not in names:
            headers.append(("Date", formatdate(usegmt=True)))
        if response.chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        else:
            headers.append(("Content-Length", str(len(response.body))))
        try:
            reason = HTTPStatus(response.status).phrase.encode()
        except ValueError:
            reason = b""
        out = conn.send(h11.Response(status_code=response.status, headers=headers,
                                     reason=reason)) or b""
        if response.body:
            out += conn.send(h11.Data(data=response.body)) or b""
        out += conn.send(h11.EndOfMessage()) or b""
        writer.write(out)
