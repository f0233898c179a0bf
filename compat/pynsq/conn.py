"""pynsq's ``nsq.conn``: ``AsyncConn``, one connection to an nsqd, and the events it triggers.

A program (or a library over pynsq) drives it as pynsq documents: ``conn.on(event, cb)``,
``conn.connect()``, then commands built by :mod:`smartnsq.compat.pynsq.protocol` through
``conn.send(...)`` / ``conn.send_rdy(n)``, and messages answered with ``message.finish()`` /
``requeue()`` / ``touch()``. Underneath is smartnsq's own connection
(:class:`smartnsq.transport.connection.Connection`): the handshake (IDENTIFY, TLS, snappy or
deflate, AUTH), heartbeats (answered with NOP before the ``heartbeat`` event) and the frame
decoding are its.

The loop. As pynsq binds to ``IOLoop.current()``, an ``AsyncConn`` binds to the loop current
on the thread that builds it (the running loop, else the thread's set loop, else a new one
that ``nsq.run()`` then runs: :mod:`smartnsq.compat.pynsq_loops`), and its connection and
every event run on that loop: in ``nsq.run()``, or in a tornado application's or test case's
IOLoop.

The events, with pynsq's keyword arguments (every listener gets ``conn=``):

* ``connect``, ``identify`` (``data``: the IDENTIFY body sent), ``response`` (``data``: the
  IDENTIFY answer's bytes) and ``identify_response`` (``data``: that answer as a dict), a
  ``response`` (``b"OK"``) per TLS or compression upgrade, ``auth`` / ``response`` /
  ``auth_response`` (when the server asked for AUTH), ``ready``: pynsq's order, once the
  handshake is done (pynsq spreads them over the handshake; smartnsq's connection does it as
  one step, so they come together after it). A connection that cannot be opened is logged and
  gets ``close`` alone, as in pynsq;
* ``message`` (``message``), ``heartbeat``, ``response`` (``data``: the answer to a command
  sent, ``b"OK"``...), ``error`` (``error``: a :class:`~smartnsq.compat.pynsq.protocol.Error`
  whose ``error`` is smartnsq's exception), and at the end ``error``
  (``ConnectionClosedError``) then ``close``, as pynsq's stream reports a close;
* ``resume`` on a message's finish, ``backoff`` on a requeue with backoff, ``continue`` on
  one without.

``data`` (raw frames) is not triggered: frames are decoded by smartnsq's connection, and every
frame reaches one of the events above.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import weakref
from typing import Any

from smartnsq.compat.pynsq_loops import release_user_loop, user_entry
from smartnsq.config import ConnectionConfig
from smartnsq.errors import ConnectionClosed, InvalidArgument, ServerError
from smartnsq.protocol import commands
from smartnsq.protocol.frames import MessageFrame
from smartnsq.protocol.numbers import is_real
from smartnsq.transport.connection import Connection

from . import event
from .message import Message
from .options import connection_options
from .protocol import ConnectionClosedError, Error, SendError, asserting, raw_id

__all__ = [
    "CONNECTED",
    "CONNECTING",
    "DEFAULT_USER_AGENT",
    "DISCONNECTED",
    "INIT",
    "AsyncConn",
    "ConnAnswers",
]

log = logging.getLogger("smartnsq.compat.pynsq")

# the states, as pynsq names them
INIT = "INIT"
DISCONNECTED = "DISCONNECTED"
CONNECTING = "CONNECTING"
CONNECTED = "CONNECTED"

DEFAULT_USER_AGENT: str | None = None
"""None: smartnsq's own user agent (``smartnsq/<version>``) goes in IDENTIFY."""

# the commands nsqd never answers; every other one gets a response or an error frame
_UNANSWERED = frozenset({"RDY", "FIN", "REQ", "TOUCH", "NOP"})


class AsyncConn(event.EventedMixin):
    """pynsq's ``AsyncConn(host, port, timeout=1.0, heartbeat_interval=30, requeue_delay=90,
    tls_v1=False, tls_options=None, snappy=False, deflate=False, deflate_level=6,
    user_agent=None, output_buffer_size=16384, output_buffer_timeout=250, sample_rate=0,
    auth_secret=None, msg_timeout=None, hostname=None)``, its arguments checked as pynsq
    asserts them and mapped to smartnsq's ``ConnectionConfig`` as a Reader's are.

    ``connect()``, ``send(data)``, ``send_rdy(n)``, ``close()``; ``connected()``,
    ``connecting()``, ``closed()``, ``id`` (``"host:port"``), ``state``, ``in_flight``,
    ``rdy`` / ``last_rdy``, ``max_rdy_count`` (the server's, after ``identify_response``),
    ``last_recv_timestamp`` / ``last_msg_timestamp`` (``time.time()``). The events: see the
    module docstring.
    """

    @asserting
    def __init__(self, host: str, port: int, timeout: float = 1.0,
                 heartbeat_interval: int = 30, requeue_delay: int = 90, tls_v1: bool = False,
                 tls_options: dict[str, Any] | None = None, snappy: bool = False,
                 deflate: bool = False, deflate_level: int = 6,
                 user_agent: str | None = DEFAULT_USER_AGENT,
                 output_buffer_size: int = 16 * 1024, output_buffer_timeout: int = 250,
                 sample_rate: int = 0, auth_secret: bytes | str | None = None,
                 msg_timeout: float | None = None, hostname: str | None = None) -> None:
        assert isinstance(host, str), "host must be a str"
        assert isinstance(port, int) and not isinstance(port, bool), "port must be an int"
        assert is_real(timeout) and timeout > 0, "timeout must be a number of seconds"
        assert isinstance(heartbeat_interval, int) and heartbeat_interval >= 1, \
            "heartbeat_interval must be an int of seconds, at least 1"
        assert is_real(requeue_delay) and requeue_delay >= 0, "requeue_delay must be >= 0"
        assert isinstance(tls_options, dict | None), "tls_options must be a dict"
        assert isinstance(output_buffer_size, int) and output_buffer_size >= 0, \
            "output_buffer_size must be an int >= 0"
        assert isinstance(output_buffer_timeout, int) and output_buffer_timeout >= 0, \
            "output_buffer_timeout must be an int of ms >= 0"
        assert isinstance(sample_rate, int) and 0 <= sample_rate < 100, \
            "sample_rate must be an int in 0..99"
        assert msg_timeout is None or (is_real(msg_timeout) and msg_timeout > 0), \
            "msg_timeout must be a number of seconds above 0"
        super().__init__()
        given: dict[str, Any] = {
            "timeout": timeout, "heartbeat_interval": heartbeat_interval,
            "requeue_delay": requeue_delay, "tls_v1": tls_v1, "tls_options": tls_options,
            "snappy": snappy, "deflate": deflate, "deflate_level": deflate_level,
            "user_agent": user_agent, "sample_rate": sample_rate, "auth_secret": auth_secret,
            "msg_timeout": msg_timeout, "hostname": hostname,
        }
        # pynsq's buffer defaults are nsqd's own: sent only when the program chose others
        if output_buffer_size != 16 * 1024:
            given["output_buffer_size"] = output_buffer_size
        if output_buffer_timeout != 250:
            given["output_buffer_timeout"] = output_buffer_timeout
        options, _ = connection_options(given)
        self.config = ConnectionConfig(**options)
        self.state = INIT
        self.host = host
        self.port = port
        self.timeout = timeout
        self.last_recv_timestamp = time.time()
        self.last_msg_timestamp = time.time()
        self.in_flight = 0
        self.rdy = 0
        self.last_rdy = 0
        self.max_rdy_count = 2500  # nsqd's, until its IDENTIFY answer says
        self.tls_v1 = tls_v1
        self.tls_options = tls_options
        self.snappy = snappy
        self.deflate = deflate
        self.deflate_level = deflate_level
        self.hostname = hostname or socket.gethostname()
        self.short_hostname = self.hostname.split(".")[0]
        self.heartbeat_interval = heartbeat_interval * 1000  # ms, as pynsq keeps it
        self.msg_timeout = int(msg_timeout * 1000) if msg_timeout else None
        self.requeue_delay = requeue_delay
        self.output_buffer_size = output_buffer_size
        self.output_buffer_timeout = output_buffer_timeout
        self.sample_rate = sample_rate
        self.user_agent = user_agent
        self.auth_secret = auth_secret.encode() if isinstance(auth_secret, str) else auth_secret
        self._conn: Connection | None = None
        self._opening: asyncio.Task[None] | None = None
        self._shutting: asyncio.Task[None] | None = None
        self._answers = ConnAnswers(self)
        entry = user_entry(acquire=True)
        self._loop = entry.loop
        self.io_loop = self._loop
        # the loop is given back when the connection closes (or this object goes unused)
        self._release = weakref.finalize(self, release_user_loop, entry)

    @property
    def id(self) -> str:
        return str(self)

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"<AsyncConn {self} {self.state}>"

    def connected(self) -> bool:
        return self.state == CONNECTED

    def connecting(self) -> bool:
        return self.state == CONNECTING

    def closed(self) -> bool:
        return self.state in (INIT, DISCONNECTED)

    # -- opening ------------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the connection on this object's loop (once it runs); a no-op unless closed.
        An ``AsyncConn`` opens once, as smartnsq's connection does: after ``close`` build a
        new one."""
        if not self.closed():
            return
        if self._conn is not None or not self._release.alive:
            raise ConnectionClosedError(f"{self} was closed: build a new AsyncConn")
        self.state = CONNECTING
        self._loop.call_soon_threadsafe(self._begin)

    def _begin(self) -> None:
        if self.state == CONNECTING and self._opening is None:
            self._opening = self._loop.create_task(self._open())

    async def _open(self) -> None:
        try:
            conn = Connection(self.host, self.port, self.config, on_message=self._on_message,
                              on_error=self._on_error)
            conn.on_heartbeat = self._on_heartbeat
            self._conn = conn
            await conn.open()
        except asyncio.CancelledError:  # close() while connecting
            self._closed_now()
            return
        except Exception as exc:
            # as pynsq: the failure is logged, and the close event follows (no error event)
            log.warning("%s: cannot connect: %s", self, exc)
            self._closed_now()
            return
        self.state = CONNECTED
        self.last_recv_timestamp = time.time()
        conn.closed.add_done_callback(self._lost)
        ident = conn.identify_response
        self.max_rdy_count = conn.max_rdy_count
        # pynsq's order: each handshake answer reaches the program's response listeners too
        # (pynsq's own handshake is one of them), then the event it stands for
        self._emit(event.CONNECT, conn=self)
        self._emit(event.IDENTIFY, conn=self, data=self.config.identify_options().to_json())
        if ident.negotiated:
            self._emit(event.RESPONSE, conn=self, data=json.dumps(ident.raw).encode())
            self._emit(event.IDENTIFY_RESPONSE, conn=self, data=dict(ident.raw))
            for _ in range(int(bool(conn.tls)) + int(conn.compression != "none")):
                self._emit(event.RESPONSE, conn=self, data=b"OK")  # an upgrade's answer
        else:
            self._emit(event.RESPONSE, conn=self, data=b"OK")
        auth = conn.auth_response
        if auth is not None:
            answer = {"identity": auth.identity, "identity_url": auth.identity_url,
                      "permission_count": auth.permission_count}
            self._emit(event.AUTH, conn=self, data=self.auth_secret)
            self._emit(event.RESPONSE, conn=self, data=json.dumps(answer).encode())
            self._emit(event.AUTH_RESPONSE, conn=self, data=answer)
        if not conn.is_closed:
            self._emit(event.READY, conn=self)

    def _lost(self, closed: asyncio.Future[BaseException | None]) -> None:
        """The connection closed: by the server or a failure (a close() of ours says so once
        the socket is closed, in :meth:`_shut`)."""
        if self._shutting is None:
            self._closed_now(None if closed.cancelled() else closed.result())

    async def _shut(self, conn: Connection) -> None:
        try:
            await conn.close()
        finally:
            self._closed_now(None)

    def _closed_now(self, reason: BaseException | None = None) -> None:
        """Once: the ``close`` event, and the loop given back. An open connection's end is
        first an ``error`` (``ConnectionClosedError``), as pynsq's stream reports it."""
        if self.state == DISCONNECTED:
            return
        was_connected = self.state == CONNECTED
        self.state = DISCONNECTED
        try:
            if was_connected:
                self._emit(event.ERROR, conn=self, error=ConnectionClosedError(
                    f"{self}: stream is closed" + (f" ({reason})" if reason else ""), reason))
            self._emit(event.CLOSE, conn=self)
        finally:
            self._release()

    # -- events from the connection (on its loop) ---------------------------------------------

    def _emit(self, name: str, **kwargs: Any) -> None:
        """Trigger ``name``; a listener's exception is logged, as pynsq logs those raised
        while it handles a frame, and the connection goes on."""
        try:
            self.trigger(name, **kwargs)
        except Exception:
            log.exception("%s: uncaught exception in a %r listener", self, name)

    def _on_message(self, frame: MessageFrame) -> None:
        now = time.time()
        self.last_recv_timestamp = self.last_msg_timestamp = now
        self.in_flight += 1
        message = Message.received(frame.id, frame, self._answers)
        self._emit(event.MESSAGE, conn=self, message=message)

    def _on_heartbeat(self) -> None:
        self.last_recv_timestamp = time.time()
        self._emit(event.HEARTBEAT, conn=self)

    def _on_error(self, error: ServerError) -> None:
        self.last_recv_timestamp = time.time()
        self._emit(event.ERROR, conn=self, error=Error(str(error), error))

    def _answered(self, future: asyncio.Future[bytes]) -> None:
        if future.cancelled():
            return
        exc = future.exception()
        if exc is None:
            self.last_recv_timestamp = time.time()
            self._emit(event.RESPONSE, conn=self, data=future.result())
        elif isinstance(exc, ServerError):
            self.last_recv_timestamp = time.time()
            self._emit(event.ERROR, conn=self, error=Error(str(exc), exc))
        elif not isinstance(exc, ConnectionClosed):  # closed: the close event says it
            self._emit(event.ERROR, conn=self, error=SendError(str(exc), exc))

    # -- what programs call ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Send one command (built by ``nsq.protocol``); its answer, if the command has one,
        comes as a ``response`` (or ``error``) event. Raises ``ConnectionClosedError`` when
        the connection is not open."""
        conn = self._conn
        if conn is None or self.state != CONNECTED:
            raise ConnectionClosedError(f"{self} is not connected", None)
        command = commands.command_name(data)
        try:
            if command in _UNANSWERED:
                conn.send(data)
            else:
                conn.submit(data, command).add_done_callback(self._answered)
        except (ConnectionClosed, InvalidArgument) as exc:
            raise ConnectionClosedError(f"{command} not sent to {self}: {exc}", exc) from exc

    def send_rdy(self, value: int) -> bool:
        """RDY ``value`` (sent only when it changes); False, with an ``error`` event and the
        connection closed, when it could not be sent."""
        if self.last_rdy != value:
            try:
                self.send(commands.rdy(value))
            except Exception as exc:
                self.close()
                self._emit(event.ERROR, conn=self,
                           error=SendError(f"failed to send RDY {value}", exc))
                return False
        self.last_rdy = self.rdy = value
        return True

    def close(self) -> None:
        """Close the connection; the ``close`` event follows on this object's loop."""
        self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        opening = self._opening
        if opening is not None and not opening.done():
            opening.cancel()
            return
        conn = self._conn
        if conn is None:
            self._closed_now()  # never connected
        elif not conn.is_closed and self._shutting is None:
            self._shutting = self._loop.create_task(self._shut(conn))

    def _answer(self, command: bytes, what: str) -> None:
        """A message's FIN/REQ/TOUCH; a failure closes the connection, as pynsq does."""
        try:
            self.send(command)
        except Exception as exc:
            self.close()
            self._emit(event.ERROR, conn=self, error=SendError(f"failed to send {what}", exc))


class ConnAnswers:
    """An ``AsyncConn``'s messages' answers (:class:`~smartnsq.compat.pynsq.message.Answers`),
    with pynsq's events: ``resume`` on a finish, ``backoff`` / ``continue`` on a requeue."""

    __slots__ = ("conn",)

    def __init__(self, conn: AsyncConn) -> None:
        self.conn = conn

    @property
    def requeue_delay(self) -> float:
        return float(self.conn.requeue_delay)

    def fin(self, message: Message) -> None:
        conn = self.conn
        conn._emit(event.RESUME, conn=conn)
        conn.in_flight -= 1
        conn._answer(commands.fin(raw_id(message.id)), f"FIN {message._id_text()}")

    def req(self, message: Message, seconds: float, backoff: bool) -> None:
        conn = self.conn
        conn._emit(event.BACKOFF if backoff else event.CONTINUE, conn=conn)
        conn.in_flight -= 1
        delay_ms = max(0, round(seconds * 1000))
        conn._answer(commands.req(raw_id(message.id), delay_ms),
                     f"REQ {message._id_text()} @ {delay_ms}")

    def touch(self, message: Message) -> None:
        self.conn._answer(commands.touch(raw_id(message.id)), f"TOUCH {message._id_text()}")

    def timeout_of(self, message: Message) -> float:
        """The negotiated ``msg_timeout`` (nsqd's 60 s before the handshake said)."""
        conn = self.conn._conn
        return float(conn.msg_timeout if conn is not None else 0.0) or 60.0

