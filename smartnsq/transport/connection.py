"""One asyncio connection to an nsqd: handshake, upgrades, calls in flight, heartbeats.

``Connection`` is an ``asyncio.BufferedProtocol`` over the sans-I/O codec: the loop reads into
one buffer per thread and ``buffer_updated`` copies out what arrived (a plain ``Protocol`` read
allocates asyncio's 256 KiB block per read); ``data_received`` runs the bytes through the
negotiated decompressor and hands whole chunks to ``FrameReader``; nothing on that path is per
byte, and a delivered message costs one ``Message`` object and one call of the consumer's
``on_message``, with no task per message.

Calls. nsqd answers the commands that have an answer (IDENTIFY, AUTH, SUB*, PUB*, MPUB*, CLS)
strictly in the order it received them, so ``request()`` needs no ids: each call appends a
future to a FIFO and the next response or error frame settles the oldest one. Commands without
an answer (RDY, FIN, REQ, TOUCH, NOP) go through ``send()``. Every command queued during one
event-loop iteration leaves in a single ``transport.write`` (or earlier, once
``flush_threshold`` bytes wait), so a thousand concurrent publishes or a burst of FINs cost a
handful of syscalls.

Errors. A non-fatal error frame settles the oldest pending call (or, for ``E_FIN_FAILED``,
``E_REQ_FAILED`` and ``E_TOUCH_FAILED``, which only fire-and-forget commands cause, goes to
``on_error``). A fatal one (per ``smartnsq.errors.ERROR_TABLE`` and the command it answers),
EOF, a stall or a corrupt stream closes the connection: the oldest call gets the typed error
and every other pending call fails at once with ``ConnectionClosed`` (its ``__cause__`` is the
reason).

Timeouts. A call that times out raises ``smartnsq.errors.Timeout`` (retriable) and keeps its
place in the FIFO: the server still owes it an answer, and when that answer comes it settles
the timed-out slot and is discarded, so every later call still gets its own answer. One
stalled partition (a real youzan nsqd leaves PUBs unanswered ~12 s while a replica is lost)
thus costs the calls that waited on it, not the connection other partitions share. A call
cancelled by its caller is kept the same way. A connection is deemed dead, and closed, only
when more than ``max_timed_out`` timed-out calls are waiting for their answers at once, or
when one stays unanswered for twice its timeout (the heartbeat watchdog catches a fully
silent link sooner). A call with no time left (``timeout <= 0``) is not sent at all.

Upgrades. After IDENTIFY the JSON answer says which upgrades really happen (a server without a
certificate answers ``tls_v1:false``, classic ``tcp_29``); each one that does is acknowledged by
one extra ``OK`` that is already encrypted/compressed. Bytes right behind an acknowledging frame
may share its read while being in the new encoding, so during the handshake frames are taken
one at a time and the rest is held raw until the new decoder is in place.

Safety. Compression is used only as negotiated: an IDENTIFY answer switching on snappy or
deflate the client did not ask for is a ``ProtocolError`` (the stream that follows was never
agreed on). Inflated data is fed to the frame reader in pieces of at most ``_INFLATE_STEP``
bytes, so a small compressed input that inflates to hundreds of MiB fails at its first bad
frame with memory bounded by the frame limit. A certificate the TLS handshake refuses raises
``TLSVerificationFailed`` at once (fatal, not retriable: retrying cannot change the
certificate), naming what the verifier said. AUTH over a connection without TLS is refused
(``PlaintextAuthRefused``) unless ``allow_plaintext_auth`` is set: the secret is never sent
in the clear by default.

Stalls. nsqd sends a heartbeat every ``heartbeat_interval`` (answered with NOP automatically);
when nothing at all arrives for twice that, the link is considered dead and the connection is
closed, failing what is pending.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol, cast

from ..config import ConnectionConfig
from ..errors import (
    ConnectionClosed,
    ConnectionFailed,
    InvalidArgument,
    NSQError,
    PlaintextAuthRefused,
    ProtocolError,
    ServerError,
    Timeout,
    TLSNotOffered,
    TLSVerificationFailed,
    certificate_refusal,
    error_from_payload,
    parse_error_payload,
)
from ..model.routes import address_text, is_unix, sun_path
from ..protocol import commands
from ..protocol.compression import StreamTransform, split_first_frame, stream_for
from ..protocol.frames import (
    CLASSIC_LAYOUT,
    ErrorFrame,
    Frame,
    Heartbeat,
    MessageFrame,
    MessageLayout,
    Response,
)
from ..protocol.identify import IdentifyOptions
from ..protocol.responses import (
    AuthResponse,
    IdentifyResponse,
    parse_auth_response,
    parse_identify_response,
)
from ..protocol.runs import MessageRun, RunReader

__all__ = ["Connection", "ErrorCallback", "MessageCallback", "RunCallback", "loop_clock"]

log = logging.getLogger("smartnsq.connection")

MessageCallback = Callable[[MessageFrame], None]
RunCallback = Callable[[MessageRun], None]
ErrorCallback = Callable[[ServerError], None]

# Errors only fire-and-forget commands cause: never the answer to a pending request.
_FIRE_AND_FORGET_ERRORS: Final = {"E_FIN_FAILED": "FIN", "E_REQ_FAILED": "REQ",
                                  "E_TOUCH_FAILED": "TOUCH"}
_NOP: Final = commands.NOP
_INFLATE_STEP: Final = 256 * 1024  # most inflated bytes handed to the frame reader at once
_USE_CONFIG: Final[Any] = object()


class AnswerSlot(Protocol):
    """What a pending call's answer is given to: an ``asyncio.Future[bytes]``, or a caller's
    object that completes its own result there (``submit(slot=...)``: no second future)."""

    def done(self) -> bool: ...
    def set_result(self, result: bytes, /) -> None: ...
    def set_exception(self, exception: BaseException, /) -> None: ...


# (answer, command name, deadline on the loop clock or None, the timeout it came from)
_Pending = tuple[AnswerSlot, str, "float | None", "float | None"]


#: the read buffer's size: asyncio's own read size for a plain Protocol
_READ_SIZE: Final = 256 * 1024
# one read buffer per thread (per event loop): the loop fills it and calls buffer_updated in
# the same step, which copies out what arrived, so connections can share it
_reads = threading.local()


def _thread_view() -> memoryview:
    """This thread's read buffer, made on first use."""
    try:
        return _reads.view  # type: ignore[no-any-return]
    except AttributeError:
        view = _reads.view = memoryview(bytearray(_READ_SIZE))
        return view


def loop_clock(loop: asyncio.AbstractEventLoop) -> Callable[[], float]:
    """``loop.time`` as a callable, cheapest form: asyncio's ``BaseEventLoop.time()`` is a
    Python method around ``time.monotonic()``, so the C function itself is returned when the
    loop has not replaced it (uvloop has its own clock, kept; so is a clock patched on the
    instance)."""
    own = type(loop).time is asyncio.BaseEventLoop.time and "time" not in getattr(
        loop, "__dict__", {})
    return time.monotonic if own else loop.time


class Connection(asyncio.BufferedProtocol):
    """A connection to one nsqd. Open it with ``await Connection.connect(host, port, config)``.

    ``on_message(msg)`` receives every delivered message, synchronously inside
    ``data_received``: it must not block (hand work to a queue or schedule it). ``on_error(err)``
    receives error frames that answer no request (``E_FIN_FAILED`` and friends, or a fatal error
    after RDY/FIN); both may be set or replaced at any time.
    """

    def __init__(self, host: str, port: int, config: ConnectionConfig | None = None, *,
                 on_message: MessageCallback | None = None,
                 on_error: ErrorCallback | None = None,
                 message_class: type[MessageFrame] = MessageFrame,
                 extend_support: bool = False, desired_tag: str = "",
                 ext_filter: dict[str, Any] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._host = host
        self._port = port
        self._config = config = config or ConnectionConfig()
        if config.tls_enabled and is_unix((host, port)):  # host is the socket's path
            config.tls_server_name(None)  # a socket has no host name: refused before connecting
        self._identify_options: IdentifyOptions = config.identify_options(
            extend_support=extend_support, desired_tag=desired_tag, ext_filter=ext_filter)
        self.on_message: MessageCallback | None = on_message
        self.on_error: ErrorCallback | None = on_error
        self.on_heartbeat: Callable[[], None] | None = None
        self._message_class = message_class
        self._reader = RunReader(CLASSIC_LAYOUT, max_frame_size=config.max_frame_size,
                                 message_class=message_class)
        #: set, it receives each stretch of consecutive messages of one read as one
        #: ``MessageRun`` where the layout makes runs (youzan, detail block): a reader that
        #: works a chunk at a time (the Spark range reader)
        self.on_run: RunCallback | None = None
        self._transport: asyncio.Transport | None = None
        self._pending: deque[_Pending] = deque()
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._deadline_at = 0.0
        self._expired: set[AnswerSlot] = set()  # slots past their deadline
        # writing
        self._wbuf: list[bytes] = []
        self._wsize = 0
        self._flush_threshold = config.flush_threshold
        self._flush_scheduled = False
        self._encoder: Callable[[bytes], bytes] | None = None
        self._write_paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        # reading
        self._decoder: StreamTransform | None = None
        self._split = True  # handshake: one frame at a time
        self._split_buf = bytearray()
        self._held: bytearray | None = None
        self._view = _thread_view()  # the loop's thread's buffer: no thread-local lookup per read
        #: loop time of the last read: the stall watchdog's clock, and the arrival time of the
        #: messages delivered in that read (one clock read per read, not per message)
        self.last_receive = self._loop.time()
        self._clock = loop_clock(self._loop)  # read once per read, on the hot path
        self._watchdog: asyncio.TimerHandle | None = None
        self._warned_no_consumer = False
        # state
        self._identify: IdentifyResponse = IdentifyResponse()
        self._auth: AuthResponse | None = None
        self._tls = ""  # the negotiated version ("TLSv1.3") once upgraded
        self._compression = "none"
        self._ready = False
        self._accepting = False  # ready and not closing: the one check calls make
        self._closing = False
        self._close_reason: BaseException | None = None
        self._closed: asyncio.Future[BaseException | None] = self._loop.create_future()
        self._lost: asyncio.Future[None] = self._loop.create_future()
        # counters (cheap; for metrics and tests)
        self.write_count = 0
        self.heartbeats = 0

    # -- opening --------------------------------------------------------------------------

    @classmethod
    async def connect(cls, host: str, port: int, config: ConnectionConfig | None = None, *,
                      on_message: MessageCallback | None = None,
                      on_error: ErrorCallback | None = None,
                      message_class: type[MessageFrame] = MessageFrame,
                      extend_support: bool = False, desired_tag: str = "",
                      ext_filter: dict[str, Any] | None = None) -> Connection:
        """Connect, IDENTIFY, upgrade and AUTH within ``config.connect_timeout``.

        ``extend_support``, ``desired_tag`` and ``ext_filter`` go into IDENTIFY (consumers of
        ext topics; ``extend_support`` must match the topic's ext flag or SUB fails).
        Raises ``ConnectionFailed`` (refused, reset, TLS failure), ``Timeout``,
        ``ServerError`` (the server refused IDENTIFY or AUTH), ``ProtocolError`` or
        ``InvalidArgument`` (bad IDENTIFY values; the server wants AUTH and no secret is set).
        """
        conn = cls(host, port, config, on_message=on_message, on_error=on_error,
                   message_class=message_class, extend_support=extend_support,
                   desired_tag=desired_tag, ext_filter=ext_filter)
        await conn.open()
        return conn

    async def open(self) -> None:
        if self._transport is not None or self._closing:
            raise RuntimeError("a Connection opens once")
        timeout = self._config.connect_timeout
        try:
            await asyncio.wait_for(self._open(), timeout)
        except asyncio.TimeoutError:
            error = Timeout(f"connecting to {self.address_text} took more than {timeout:g}s")
            self._fail(error)
            raise error from None
        except ConnectionClosed as exc:
            reason = self._close_reason
            if isinstance(reason, NSQError) and not isinstance(reason, ConnectionFailed):
                # say why (a corrupt stream, a fatal frame...) and from which nsqd, not just
                # "closed"; its own cause kept (``from exc`` loops: exc's cause is this reason)
                if isinstance(reason, ServerError):
                    reason = reason.from_node(self.address_text)
                raise reason from reason.__cause__
            self._fail(exc)
            raise
        except BaseException as exc:
            self._fail(exc if isinstance(exc, NSQError) else
                       ConnectionClosed(f"handshake with {self.address_text} failed: {exc!r}"))
            raise
        finally:
            if not self._accepting:
                # aborted: nothing left to wait for (a failed TLS handshake may never report
                # connection_lost to us, so close() must not wait for it)
                self._transport = None
                if not self._lost.done():
                    self._lost.set_result(None)

    async def _open(self) -> None:
        try:
            await (self._loop.create_unix_connection(lambda: self, sun_path(self.address))
                   if is_unix(self.address) else
                   self._loop.create_connection(lambda: self, self._host, self._port))
        except (OSError, NotImplementedError) as exc:  # no unix sockets: Windows' loops
            raise ConnectionFailed(f"cannot connect to {self.address_text}: {exc}") from exc
        options = self._identify_options
        body = options.to_json()
        log.debug("%s: IDENTIFY %s", self.address_text, json.dumps(body))
        answer = self._expect("IDENTIFY")
        self._queue(commands.MAGIC_V2 + commands.identify(body))
        ident = parse_identify_response(await answer)
        self._identify = ident
        self._reader.layout = MessageLayout(
            youzan=ident.is_youzan, ext=ident.is_youzan and options.extend_support)
        self._arm_watchdog()

        compression = "snappy" if ident.snappy else "deflate" if ident.deflate else "none"
        asked = "snappy" if options.snappy else "deflate" if options.deflate else "none"
        if (ident.snappy and ident.deflate) or compression not in ("none", asked):
            on = "snappy and deflate" if ident.snappy and ident.deflate else compression
            raise ProtocolError(f"{self.address_text} switched on {on} compression, which was "
                                f"not asked for (asked: {asked}); refusing a stream that was "
                                "not negotiated")
        if options.tls_v1 and not ident.tls_v1:
            if self._config.tls_required:
                raise TLSNotOffered(self.address_text)
            log.warning("%s: TLS asked for but not offered; going on in plaintext",
                        self.address_text)
        if ident.tls_v1:
            await self._upgrade_tls(more=compression != "none")
        if compression != "none":
            await self._upgrade_compression(compression, ident.deflate_level)
        else:
            self._release(split=False)
        if ident.auth_required:
            await self._authenticate()
        elif self._config.auth_secret is not None:
            log.debug("%s: no auth required; secret not sent", self.address_text)
        if self._closing:  # a fatal or corrupt frame came with the last handshake answer
            raise self._closed_error("IDENTIFY")
        self._ready = True
        self._accepting = True
        log.debug("%s: ready (%s, tls=%s, compression=%s)", self.address_text,
                  ident.version or "unknown version", self._tls, self._compression)

    async def _upgrade_tls(self, *, more: bool) -> None:
        context = self._config.ssl_context()
        if context is None:
            raise ProtocolError(f"{self.address_text} upgraded to TLS unasked")
        if self._held:
            raise ProtocolError(f"{self.address_text} sent data before the TLS handshake")
        transport = self._transport
        assert transport is not None
        hostname = self._config.tls_server_name(None if is_unix(self.address) else self._host)
        try:
            upgraded = await self._loop.start_tls(
                transport, self, context, server_hostname=hostname,
                ssl_handshake_timeout=self._config.connect_timeout)
        except ssl.SSLCertVerificationError as exc:
            raise TLSVerificationFailed(self.address_text, _verify_reason(exc)) from exc
        except (OSError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            raise certificate_refusal(self.address_text, exc) or ConnectionFailed(
                f"TLS handshake with {self.address_text} failed: {exc}") from exc
        if upgraded is None:
            raise ConnectionClosed(f"{self.address_text} closed during the TLS handshake")
        self._transport = upgraded
        self._tls = upgraded.get_extra_info("ssl_object").version() or "TLS"
        answer = self._expect("IDENTIFY")
        self._release(split=more)
        await self._expect_ok(answer, "TLS")

    async def _upgrade_compression(self, compression: str, level: int) -> None:
        # the server's level is what it uses; ours only has to decode it, any level does
        transform: StreamTransform | None = stream_for(
            "snappy" if compression == "snappy" else "deflate",
            min(max(level, 1), 9) if compression == "deflate" else 6)
        assert transform is not None
        self._encoder = transform.compress
        self._decoder = transform
        self._compression = compression
        answer = self._expect("IDENTIFY")
        self._release(split=False)
        await self._expect_ok(answer, compression)

    async def _expect_ok(self, answer: asyncio.Future[bytes], what: str) -> None:
        data = await answer
        if data != b"OK":
            raise ProtocolError(f"{self.address_text} acknowledged the {what} upgrade with "
                                f"{data[:40]!r} instead of OK")

    async def _authenticate(self) -> None:
        secret = self._config.auth_secret
        if secret is None:
            raise InvalidArgument("auth_secret",
                                  f"{self.address_text} requires AUTH; configure a secret")
        if not self._tls and not self._config.allow_plaintext_auth:
            raise PlaintextAuthRefused(self.address_text)
        answer = self._expect("AUTH")
        self._queue(commands.auth(secret))
        self._auth = parse_auth_response(await answer)
        log.info("%s: authenticated as %r (%d permissions)", self.address_text,
                 self._auth.identity, self._auth.permission_count)

    def _expect(self, command: str) -> asyncio.Future[bytes]:
        """A pending slot for an answer that needs no timer (the handshake has a deadline);
        ``ConnectionClosed`` when the connection already closed (nothing would answer)."""
        if self._closing:
            raise self._closed_error(command)
        future: asyncio.Future[bytes] = self._loop.create_future()
        self._pending.append((future, command, None, None))
        return future

    def _release(self, *, split: bool) -> None:
        """Process the bytes held at an encoding boundary, now that the decoder is in place."""
        held = self._held
        self._held = None
        self._split = split
        if held:
            self._receive(bytes(held))

    # -- calls ------------------------------------------------------------------------------

    def submit(self, data: bytes, command: str | None = None,
               timeout: float | None = _USE_CONFIG, *, now: bool = False,
               alone: bool = False, slot: AnswerSlot | None = None,
               deadline: float | None = None) -> asyncio.Future[bytes]:
        """Queue a command that gets an answer; the future settles with the answer's payload.

        ``command`` names it for error attribution (``"PUB"``, ``"SUB_ORDERED"``...; read from
        ``data`` when omitted). ``timeout`` defaults to ``config.request_timeout``; past it
        the future raises ``Timeout`` and the late answer, if any, is discarded (see the
        module docstring). A future that fails must be awaited or have its exception read,
        like any asyncio future. Raises ``ConnectionClosed`` at once when the connection is
        closed, and ``Timeout`` at once, sending nothing, when ``timeout <= 0``.

        ``now=True`` writes at once instead of on the next loop turn: for a caller that knows
        nothing else will join this write (a lone publish awaited before the next one), the
        turn would only add latency and a callback. ``slot`` (an :class:`AnswerSlot`) takes
        the answer instead of a new future, and is returned. ``alone=True`` writes at once
        only when no other call is waiting for its answer (a lone request, awaited before the
        next: a burst's first call goes at once and the rest coalesce). ``deadline``: the loop
        time the ``timeout`` ends at, when the caller has it already (no second clock read).
        """
        if not self._accepting:
            raise self._not_accepting(command)
        if command is None:
            command = commands.command_name(data)
        if timeout is _USE_CONFIG:
            timeout = self._config.request_timeout
        if timeout is not None and timeout <= 0:
            raise Timeout(f"{command} to {self.address_text} not sent: no time left "
                          f"(timeout {timeout:g}s)")
        pending = self._pending
        if alone and not pending:
            now = True
        future = self._loop.create_future() if slot is None \
            else cast("asyncio.Future[bytes]", slot)
        if timeout is None:
            pending.append((future, command, None, None))
        else:
            if deadline is None:
                deadline = self._loop.time() + timeout
            pending.append((future, command, deadline, timeout))
            if self._deadline_timer is None or deadline < self._deadline_at:
                self._arm_deadline(deadline)
        self._queue(data, now)
        return future

    async def request(self, data: bytes, command: str | None = None,
                      timeout: float | None = _USE_CONFIG) -> bytes:
        """Send a command that gets an answer and return the answer's payload.

        Waits first while the transport is over its high-water mark (back-pressure).
        Raises the typed ``ServerError`` for an error frame, ``Timeout``, or
        ``ConnectionClosed``.
        """
        if self._write_paused:
            await self.drain()
        return await self.submit(data, command, timeout)

    def send(self, data: bytes) -> None:
        """Queue a command without an answer (RDY, FIN, REQ, TOUCH, NOP), written with the
        turn's other commands.

        Raises ``ConnectionClosed`` when the connection is closed: the command cannot reach
        the server any more (a FIN lost this way means the message will be redelivered).
        """
        if not self._accepting:
            raise self._not_accepting(commands.command_name(data))
        self._queue(data, False)

    def send_now(self, data: bytes) -> None:
        """:meth:`send`, written at once, as ``submit(now=True)`` is: for a command nothing
        can join (an ordered FIN: the partition's next message waits for it). A method of its
        own, not a keyword, because it is called once per ordered message."""
        if not self._accepting:
            raise self._not_accepting(commands.command_name(data))
        if self._wbuf:
            self._queue(data, True)  # behind what is queued, in one write
        else:
            self._write(data)

    def _not_accepting(self, command: str | None) -> Exception:
        if self._closing:
            return self._closed_error(command)
        return RuntimeError("the connection is not open yet: use Connection.connect()")

    async def drain(self) -> None:
        """Write what is queued and wait while the transport is over its high-water mark."""
        self._flush()
        while self._write_paused and not self._closing:
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter
        if self._closing:
            raise self._closed_error(None)

    def _arm_deadline(self, when: float) -> None:
        # One timer per connection, not one per call: calls are answered in order, so the
        # timer only has to wake up for the earliest deadline still pending.
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        self._deadline_at = when
        self._deadline_timer = self._loop.call_at(when, self._check_deadlines)

    def _check_deadlines(self) -> None:
        """Fail the calls past their deadline (their slots stay: the answers are still owed)
        and decide whether the connection is dead; re-arm for the next thing to check."""
        self._deadline_timer = None
        if self._closing:
            return
        now = self._loop.time()
        expired = self._expired
        wake: float | None = None
        newly: list[_Pending] = []
        for entry in self._pending:
            future, command, deadline, timeout = entry
            if deadline is None or timeout is None:
                continue
            if deadline > now:
                when = deadline
            else:
                if future not in expired:
                    expired.add(future)
                    newly.append(entry)
                when = deadline + timeout  # unanswered for twice its timeout: dead
                if when <= now:
                    self._fail(ConnectionClosed(
                        f"{command} to {self.address_text} still unanswered {2 * timeout:g}s "
                        "after it was sent; the connection is deemed dead"))
                    return
            if wake is None or when < wake:
                wake = when
        for future, command, _, timeout in newly:
            if not future.done():
                future.set_exception(Timeout(f"{command} to {self.address_text} got no answer "
                                             f"within {timeout:g}s"))
        if newly:
            log.info("%s: %d call(s) timed out (%s); keeping their slots, %d late answer(s) "
                     "owed", self.address_text, len(newly), newly[0][1], len(expired))
        limit = self._config.max_timed_out
        if len(expired) > limit:
            self._fail(ConnectionClosed(
                f"{len(expired)} requests timed out and are still unanswered by "
                f"{self.address_text} (max_timed_out={limit}); the connection is deemed dead"))
            return
        if wake is not None:
            self._arm_deadline(wake)

    # -- writing ----------------------------------------------------------------------------

    def _queue(self, data: bytes, now: bool = False) -> None:
        if now and not self._wbuf:
            self._write(data)
            return
        self._wbuf.append(data)
        self._wsize += len(data)
        if now or self._wsize >= self._flush_threshold:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def _flush(self) -> None:
        buf = self._wbuf
        if not buf:
            return
        data = buf[0] if len(buf) == 1 else b"".join(buf)
        buf.clear()
        self._wsize = 0
        self._write(data)

    def _write(self, data: bytes) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._encoder is not None:
            data = self._encoder(data)
        transport.write(data)
        self.write_count += 1

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- reading ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport; not isinstance-checked: uvloop's TCPTransport does not subclass
        # asyncio.Transport, and asserting it made every uvloop connection fail
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        # data_received's plain case inline: one Python call less per read, which on an
        # ordered subscription is one call less per message
        self.last_receive = self._clock()
        data = bytes(self._view[:nbytes])
        if self._held is None and self._decoder is None:
            self._consume(data)
        elif self._held is not None:
            self._held += data
        else:
            self._receive(data)

    def data_received(self, data: bytes) -> None:
        self.last_receive = self._clock()
        if self._held is not None:
            self._held += data
        elif self._decoder is None:
            self._consume(data)  # the plain stream: no inflating step
        else:
            self._receive(data)

    def _receive(self, data: bytes) -> None:
        decoder = self._decoder
        if decoder is None:
            self._consume(data)
            return
        # bounded pieces: a compressed stream cannot make us hold more than one step of
        # inflated bytes beyond what the frame reader buffers (at most max_frame_size)
        step = min(_INFLATE_STEP, self._config.max_frame_size)
        while True:
            try:
                piece = decoder.decompress(data, step)
            except ProtocolError as exc:
                self._corrupt(exc)
                return
            data = b""
            if piece:
                self._consume(piece)
            if self._closing or not decoder.more:
                return

    def _corrupt(self, exc: ProtocolError) -> None:
        """The stream cannot be read on: fail with an error naming this nsqd (the parser sees
        bytes, not peers; a subclass keeps its own type and text)."""
        log.warning("%s: corrupt stream: %s", self.address_text, exc)
        named = ProtocolError(f"{self.address_text}: corrupt stream: {exc}")
        named.__cause__ = exc
        self._fail(named if type(exc) is ProtocolError else exc)

    def _consume(self, data: bytes) -> None:
        """Frames from bytes in the stream's plain encoding."""
        try:
            if self._split:
                self._receive_one_by_one(data)
                return
            frames: Sequence[Frame | MessageRun] = self._reader.feed(data) \
                if self.on_run is None else self._reader.feed_runs(data)
        except ProtocolError as exc:
            self._corrupt(exc)
            return
        message_class = self._message_class
        on_message = self.on_message
        for frame in frames:
            cls = frame.__class__
            if cls is message_class:
                if on_message is None:
                    self._no_consumer()
                    continue
                try:
                    on_message(frame)  # type: ignore[arg-type]
                except Exception:
                    log.exception("%s: on_message raised", self.address_text)
            elif cls is MessageRun:
                try:
                    self.on_run(frame)  # type: ignore[misc, arg-type]
                except Exception:
                    log.exception("%s: on_run raised", self.address_text)
            elif cls is Response:
                self._on_response(frame.data)  # type: ignore[union-attr]
            elif cls is Heartbeat:
                self._on_heartbeat()
            elif cls is ErrorFrame:
                self._on_error_frame(frame.payload)  # type: ignore[union-attr]
                if self._closing:
                    return

    def _receive_one_by_one(self, data: bytes) -> None:
        buf = self._split_buf
        buf += data
        while self._held is None and not self._closing:
            end = split_first_frame(buf)
            if not end:
                return
            chunk = bytes(buf[:end])
            del buf[:end]
            for frame in self._reader.feed(chunk):
                settled = self._dispatch(frame)
                if settled and self._held is None:
                    # the next bytes may be in a new encoding: keep them raw for now
                    self._held = bytearray(buf)
                    buf.clear()

    def _dispatch(self, frame: object) -> bool:
        """Handle one frame; true when it settled a pending call."""
        if isinstance(frame, Response):
            return self._on_response(frame.data)
        if isinstance(frame, ErrorFrame):
            return self._on_error_frame(frame.payload)
        if isinstance(frame, Heartbeat):
            self._on_heartbeat()
        elif isinstance(frame, MessageFrame):
            if self.on_message is None:
                self._no_consumer()
            else:
                self.on_message(frame)
        return False

    def _on_response(self, data: bytes) -> bool:
        if not self._pending:
            log.warning("%s: unexpected response %r with no call pending", self.address_text,
                        data[:40])
            return False
        future = self._pending.popleft()[0]
        if not future.done():
            future.set_result(data)
        elif self._expired:
            self._expired.discard(future)
            log.debug("%s: late answer %r discarded", self.address_text, data[:40])
        return True

    def _on_heartbeat(self) -> None:
        self.heartbeats += 1
        if not self._closing:
            self._queue(_NOP)
        callback = self.on_heartbeat
        if callback is not None:
            try:
                callback()
            except Exception:
                log.exception("%s: on_heartbeat raised", self.address_text)

    def _on_error_frame(self, payload: bytes) -> bool:
        code, _ = parse_error_payload(payload)
        caused_by = _FIRE_AND_FORGET_ERRORS.get(code)
        if caused_by is None and self._pending:
            future, command, _, _ = self._pending.popleft()
            error = error_from_payload(payload, command)
            if not future.done():
                future.set_exception(error)
            else:
                self._expired.discard(future)
                log.info("%s: %s for a call given up on", self.address_text, error)
            if error.fatal:
                self._fail(error)
            return True
        error = error_from_payload(payload, caused_by)
        callback = self.on_error
        if callback is not None:
            try:
                callback(error)
            except Exception:
                log.exception("%s: on_error raised", self.address_text)
        else:
            log.warning("%s: %s", self.address_text, error)
        if error.fatal:
            self._fail(error)
        return False

    def _no_consumer(self) -> None:
        if not self._warned_no_consumer:
            self._warned_no_consumer = True
            log.warning("%s: message received but no on_message is set; dropped (the server "
                        "redelivers it after msg_timeout)", self.address_text)

    def eof_received(self) -> bool | None:
        return None  # let the transport close; connection_lost does the rest

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)
        if not self._closing:
            reason: NSQError = certificate_refusal(self.address_text, exc) or ConnectionClosed(
                f"{self.address_text} closed the connection" if exc is None
                else f"connection to {self.address_text} lost: {exc}")
            reason.__cause__ = exc
            self._fail(reason)
        self._transport = None

    # -- stalls -----------------------------------------------------------------------------

    def _arm_watchdog(self) -> None:
        interval = self._config.heartbeat_interval
        if interval is None or self._closing:
            return
        self._watchdog = self._loop.call_at(self.last_receive + 2 * interval, self._check_stall)

    def _check_stall(self) -> None:
        self._watchdog = None
        if self._closing:
            return
        interval = self._config.heartbeat_interval
        assert interval is not None
        idle = self._loop.time() - self.last_receive
        if idle >= 2 * interval - 0.005:
            log.warning("%s: nothing received for %.1fs (heartbeats every %gs); closing as "
                        "stalled", self.address_text, idle, interval)
            self._fail(ConnectionClosed(f"{self.address_text} stalled: nothing received for "
                                        f"{idle:.1f}s"))
        else:
            self._arm_watchdog()

    # -- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Write what is queued, close the socket and fail pending calls with ConnectionClosed.

        Subscribed consumers send CLS and wait for ``CLOSE_WAIT`` (and their in-flight
        messages) before calling this.
        """
        if not self._closing:
            self._flush()
            self._fail(None)
        if self._transport is not None and not self._lost.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._lost), self._config.close_timeout)
            except asyncio.TimeoutError:
                if self._transport is not None:
                    self._transport.abort()

    def abort(self) -> None:
        """Drop the connection at once, without writing what is queued; also ends a
        ``close()`` under way (an owner out of time cannot wait for its flush)."""
        if self._closing and self._transport is not None and not self._lost.done():
            self._transport.abort()
        self._fail(None, abort=True)

    def _fail(self, reason: BaseException | None, *, abort: bool = False) -> None:
        """Close for ``reason`` (``None``: a clean close asked by the owner), failing all calls."""
        if self._closing:
            return
        self._closing = True
        self._accepting = False
        self._close_reason = reason
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, deque()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        for future, command, _, _ in pending:
            if not future.done():
                future.set_exception(self._closed_error(command))
        self._expired.clear()
        self._wake_drainers()
        transport = self._transport
        if transport is not None:
            if abort or reason is not None:
                self._wbuf.clear()
                transport.abort()
            else:
                transport.close()
        if not self._closed.done():
            self._closed.set_result(reason)

    def _closed_error(self, command: str | None) -> ConnectionClosed:
        reason = self._close_reason
        what = f"{command} not answered: " if command else ""
        if reason is None:
            error = ConnectionClosed(f"{what}connection to {self.address_text} closed")
        else:
            error = ConnectionClosed(f"{what}connection to {self.address_text} closed: {reason}")
            error.__cause__ = reason
        return error

    # -- properties -------------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self._port

    @property
    def address_text(self) -> str:
        return address_text((self._host, self._port))

    @property
    def local_address(self) -> str:
        """This end's ``host:port`` (what a trace line names as the client), ``"?"`` if closed."""
        transport = self._transport
        sock = None if transport is None else transport.get_extra_info("sockname")
        if isinstance(sock, tuple) and len(sock) >= 2:
            return f"{sock[0]}:{sock[1]}"
        return "?" if sock is None else str(sock)

    @property
    def config(self) -> ConnectionConfig:
        return self._config

    @property
    def identify_response(self) -> IdentifyResponse:
        """The server's IDENTIFY answer: version, limits, what was negotiated."""
        return self._identify

    @property
    def auth_response(self) -> AuthResponse | None:
        return self._auth

    @property
    def version(self) -> str:
        return self._identify.version

    @property
    def is_youzan(self) -> bool:
        """A youzan (HA) nsqd: binary message ids, partitions, SUB_ORDERED, tracing."""
        return self._identify.is_youzan

    @property
    def extend_support(self) -> bool:
        """Whether this connection IDENTIFYed with extend_support (ext blocks on messages)."""
        return self._identify_options.extend_support

    @property
    def max_rdy_count(self) -> int:
        return self._identify.max_rdy_count

    @property
    def msg_timeout(self) -> float:
        """The server's redelivery timeout for this connection, in seconds."""
        return self._identify.msg_timeout / 1000

    @property
    def max_msg_timeout(self) -> float:
        """The longest msg_timeout the server allows (and the bound for TOUCH), in seconds."""
        return self._identify.max_msg_timeout / 1000

    @property
    def tls(self) -> bool:
        return bool(self._tls)

    @property
    def tls_version(self) -> str:
        """The TLS version negotiated (``"TLSv1.3"``), ``""`` without TLS."""
        return self._tls

    @property
    def compression(self) -> str:
        """``"none"``, ``"snappy"`` or ``"deflate"``, as negotiated."""
        return self._compression

    @property
    def layout(self) -> MessageLayout:
        """How message frames are decoded; the consumer sets it after SUB (see protocol.frames)."""
        return self._reader.layout

    @layout.setter
    def layout(self, layout: MessageLayout) -> None:
        self._reader.layout = layout

    @property
    def is_ready(self) -> bool:
        """Handshake done and not closing: calls may be made."""
        return self._ready and not self._closing

    @property
    def is_closed(self) -> bool:
        """Closing or closed: every call now raises ``ConnectionClosed``."""
        return self._closing

    @property
    def closed(self) -> asyncio.Future[BaseException | None]:
        """Settles when the connection closes, with the reason (``None`` for ``close()``); it
        never raises, so owners can ``await`` it or add a done callback freely."""
        return self._closed

    @property
    def close_reason(self) -> BaseException | None:
        return self._close_reason

    @property
    def writing_paused(self) -> bool:
        """The transport is over its high-water mark; ``request()`` waits, ``drain()`` too."""
        return self._write_paused

    @property
    def pending_count(self) -> int:
        """Calls sent and not yet answered (timed-out ones included: answers still owed)."""
        return len(self._pending)

    @property
    def timed_out_count(self) -> int:
        """Calls that timed out and whose late answers have not come yet."""
        return len(self._expired)

    def __repr__(self) -> str:
        state = ("closed" if self._closing else "ready" if self._ready else "opening")
        flavour = "youzan" if self.is_youzan else "classic" if self._identify.negotiated else "?"
        return f"<Connection {self.address_text} {flavour} {state}>"


def _verify_reason(exc: ssl.SSLCertVerificationError) -> str:
    """One line naming the certificate problem ("self-signed certificate in certificate
    chain", "Hostname mismatch, certificate is not valid for 'x'", "certificate has
    expired"...)."""
    message = exc.verify_message or exc.reason or str(exc)
    return " ".join(str(message).split())
