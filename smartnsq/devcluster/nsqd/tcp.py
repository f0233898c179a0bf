"""One client connection to the dev cluster's nsqd: TCP protocol V2, youzan or classic 1.3.

The connection is an ``asyncio.Protocol``: received bytes go through the stream transform
(snappy/deflate, after IDENTIFY) into the sans-I/O :class:`~smartnsq.devcluster.nsqd.reader.
CommandReader`, and each event is handled at once. Commands that carry a body are generators
that yield what they need to read next (``READ_INT32`` or a byte count), so every check sits
exactly where the real server makes it: a too-large length is refused before the body arrives,
and a non-fatal error in the middle of an MPUB leaves the rest of its body to be read as
commands, as on the real servers.

Writes are coalesced: frames queue up and go out in one ``transport.write`` per event-loop
iteration (compressed as one block when snappy or deflate is on). Heartbeats tick at the
IDENTIFY interval; a client silent for 3 intervals (classic: 2) is disconnected without an
error frame.

Every error text is the real server's (see ``error_frames``); which ones close the connection
follows the captures: youzan's FIN/SUB ``E_FAILED_ON_NOT_LEADER`` is fatal, its PUB one is not,
and only ``E_FIN_FAILED``/``E_REQ_FAILED``/``E_TOUCH_FAILED`` (and youzan's publish errors
after the body) keep a connection open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import Callable, Generator
from struct import Struct
from typing import Any, Final, cast

from ...protocol.compression import DeflateStream, SnappyStream, StreamTransform
from ...protocol.frames import (
    CLASSIC_LAYOUT,
    HEARTBEAT_FRAME,
    YOUZAN_LAYOUT,
    MessageLayout,
    encode_error,
    encode_message,
    encode_response,
)
from ..state import ClusterState, PartitionInfo
from . import identify as ident
from .auth import Identity
from .channels import Channel, Consumer, Entry, ExtFilter
from .error_frames import (
    ClientError,
    GoParseError,
    as_int64,
    fatal,
    go_atoi,
    go_base10,
    go_bytes,
    go_param_list,
    go_parse_bool,
    go_quote,
    nonfatal,
)
from .options import Settings
from .publish import HOLD, READ_INT32, PublishCommands, valid_name
from .reader import CommandReader, Int32, Line, Magic
from .view import NodeView, start_index

__all__ = ["NsqdConnection"]

log = logging.getLogger("smartnsq.devcluster.nsqd")

OK: Final = b"OK"
STATE_INIT: Final = 0
STATE_SUBSCRIBED: Final = 3
STATE_CLOSING: Final = 4

_ID: Final = Struct(">QQ")
_START_KINDS: Final = ("timestamp", "virtual_queue", "msgcount", "special")

Handler = Callable[["NsqdConnection", list[bytes]], Any]


class _AlertingSSLObject(ssl.SSLObject):
    """A server-side TLS object that sends its refusal before the connection ends.

    With TLS 1.3 the server judges the client's certificate after the client has finished its
    handshake; the real nsqd then sends the alert (``bad certificate``, or ``certificate
    required`` for a missing one) and closes, so the client reads why. asyncio closes the
    socket on a failed server handshake without flushing what OpenSSL wrote, the alert
    included: the client would see a plain close, which looks like a lost connection. The first
    handshake failure is therefore reported as "want more data", which makes asyncio send the
    pending bytes (the alert); the failure itself is raised on the next call, which the
    client's close (or the handshake timeout) brings about.
    """

    _refusal: ssl.SSLError | None = None

    def do_handshake(self) -> None:
        if self._refusal is not None:
            raise self._refusal
        try:
            super().do_handshake()
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            raise
        except ssl.SSLError as exc:
            self._refusal = exc
            raise ssl.SSLWantReadError(ssl.SSL_ERROR_WANT_READ,
                                       "refused; the alert is sent first") from exc


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


class NsqdConnection(PublishCommands, asyncio.Protocol):
    """The server side of one client connection."""

    def __init__(self, node: NodeView) -> None:
        self.node = node
        self.state: ClusterState = node.state
        self.opts: Settings = node.options
        self.youzan = not node.classic
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.reader = CommandReader(binary_ids=self.youzan)
        self._handlers = YOUZAN_HANDLERS if self.youzan else CLASSIC_HANDLERS
        self._out: list[bytes] = []
        self._flush_handle: asyncio.Handle | None = None
        self._stream: StreamTransform | None = None
        self._pending: Generator[int, Any, bytes | None] | None = None
        self._closed = False
        self._suspended = False  # a TLS handshake is under way: no reads, no writes
        # a PUB waits for a stalled partition (HOLD): no further command is read meanwhile,
        # as the real server's IOLoop blocks in the write
        self._held_on: PartitionInfo | None = None
        self._hold_on: PartitionInfo | None = None  # set by the command that yields HOLD
        self._hold_timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # client state, as IDENTIFY/AUTH/SUB set it
        self.client_state = STATE_INIT
        self.client_id = ""
        self.hostname = ""
        self.user_agent = ""
        self.heartbeat_interval = self.opts.heartbeat_interval  # ms, 0 = disabled
        self.msg_timeout = self.opts.msg_timeout  # ms
        self.output_buffer_size = self.opts.output_buffer_size
        self.output_buffer_timeout = self.opts.output_buffer_timeout
        self.sample_rate = 0
        self.desired_tag = ""
        self.extend_support = False
        self.ext_filter: ExtFilter | None = None
        self.ext_filter_spec: dict[str, Any] = {}  # as IDENTIFY sent it (/stats shows it)
        self.asked_buffer_size = 0  # IDENTIFY's output_buffer_size, 0 if none (/stats)
        # (topic, partition) -> [messages published, errors, last publish unix time]
        self.pub_stats: dict[tuple[str, int], list[int]] = {}
        self.tls = False
        self.snappy = False
        self.deflate = False
        self.identity: Identity | None = None
        self._identified = False
        self.consumer: Consumer | None = None
        self.channel: Channel | None = None
        self.partition: PartitionInfo | None = None
        self.layout: MessageLayout = YOUZAN_LAYOUT if self.youzan else CLASSIC_LAYOUT
        self.connect_time = int(time.time())
        self._last_read = self.loop.time()
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._deadline_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<NsqdConnection {self.remote} on {self.node.name}>"

    # -- asyncio.Protocol -----------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # a stream transport, not isinstance-checked: uvloop's TCPTransport does not subclass
        # asyncio.Transport, and the demo runs the dev cluster on the client's (uvloop) loop
        self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and len(peer) >= 2:
            self.remote = f"{peer[0]}:{peer[1]}"
        self.node.connections.add(self)
        self._restart_heartbeat()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self._last_read = self.loop.time()
        if self._stream is not None:
            try:
                data = self._stream.decompress(data)
            except Exception as exc:  # a corrupt compressed stream: Go's reader errors out
                log.debug("%r: undecodable stream: %s", self, exc)
                self.close()
                return
        self.reader.feed(data)
        self._process()

    def eof_received(self) -> bool | None:
        return None  # the client closed its side: so do we (nsqd's read loop ends at EOF)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._teardown()

    # -- reading --------------------------------------------------------------------------------

    def _process(self) -> None:
        reader = self.reader
        while not self._closed and not self._suspended and self._held_on is None:
            event = reader.next_event()
            if event is None:
                return
            if self._pending is not None:
                self._step(event.value if type(event) is Int32 else event.data)  # type: ignore[union-attr]
            elif type(event) is Line:
                self._command(event.params)
            elif type(event) is Magic:
                if not event.ok:
                    self._write(encode_error(b"E_BAD_PROTOCOL"))
                    self.close()
                elif 0 < self.opts.max_connections < len(self.node.connections):
                    # youzan's connection limit: a bare text, no error code
                    self._write(encode_error(b"too much client connections"))
                    self.close()
            else:  # LineTooLong: bufio gave up on the line
                self.close()

    def _command(self, params: list[bytes]) -> None:
        name = params[0]
        try:
            if self.opts.tls_required and not self.tls and name != b"IDENTIFY":
                raise fatal("E_INVALID", b"cannot " + name + b" in current state (TLS required)")
            handler = self._handlers.get(name)
            if handler is None:
                what = go_param_list(params) if self.youzan else _text(name)
                raise fatal("E_INVALID", f"invalid command {what}")
            result = handler(self, params)
        except ClientError as exc:
            self._error(exc)
            return
        if result is None:
            return
        if type(result) is bytes:
            self._respond(result)
            return
        self._pending = result
        self._step(None)

    def _step(self, value: Any) -> None:
        gen = self._pending
        assert gen is not None
        try:
            wanted = gen.send(value)
        except StopIteration as stop:
            self._pending = None
            if stop.value is not None:
                self._respond(stop.value)
            return
        except ClientError as exc:
            self._pending = None
            self.reader.expect_line()
            self._error(exc)
            return
        if wanted == READ_INT32:
            self.reader.expect_int32()
        elif wanted == HOLD:
            self._hold()
        else:
            self.reader.expect_bytes(wanted)

    def _hold(self) -> None:
        """Leave the pending command unanswered until its partition's stall is over."""
        p = self._hold_on
        assert p is not None, "HOLD without a partition"
        self._held_on = p
        if self.transport is not None:
            self.transport.pause_reading()  # bounded: what the client sends waits in its socket
        self._hold_timer = self.loop.call_later(max(0.0, p.stalled_until - time.monotonic()),
                                                self._release)

    def _release(self) -> None:
        self._hold_timer = None
        p = self._held_on
        if self._closed or p is None:
            return
        if p.stalled():  # the stall was extended meanwhile
            self._hold_timer = self.loop.call_later(p.stalled_until - time.monotonic(),
                                                    self._release)
            return
        self._held_on = None
        self._last_read = self.loop.time()  # the read deadline restarts with the next read
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()
        self._step(None)
        self._process()

    # -- writing --------------------------------------------------------------------------------

    def _write(self, frame: bytes) -> None:
        self._out.append(frame)
        if self._flush_handle is None and not self._suspended:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        out = self._out
        if not out or self._suspended or self.transport is None:
            return
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        if self._stream is not None:
            data = self._stream.compress(data)
        if not self.transport.is_closing():
            self.transport.write(data)

    def _respond(self, data: bytes) -> None:
        self._write(encode_response(data))

    def _error(self, exc: ClientError) -> None:
        log.debug("%r: %s (%s)", self, exc, "fatal" if exc.fatal else "non-fatal")
        self._write(encode_error(exc.payload))
        if exc.fatal:
            self.close()

    def close(self) -> None:
        """Flush what is queued and close (the server's ``conn.Close()``)."""
        if self._closed:
            return
        self._flush()
        self._closed = True
        self._teardown()
        if self.transport is not None:
            self.transport.close()

    def abort(self) -> None:
        """Drop the connection at once, as a crashed server would."""
        self._closed = True
        self._teardown()
        if self.transport is not None:
            self.transport.abort()

    def _teardown(self) -> None:
        for timer in (self._heartbeat_timer, self._deadline_timer, self._flush_handle,
                      self._hold_timer):
            if timer is not None:
                timer.cancel()
        self._heartbeat_timer = self._deadline_timer = self._flush_handle = None
        self._hold_timer = None
        self._held_on = None
        self.node.connections.discard(self)
        if self.consumer is not None and self.channel is not None:
            self.channel.remove(self.consumer, requeue=self.youzan)
        self.consumer = None
        if self._pending is not None:
            self._pending.close()
            self._pending = None

    # -- heartbeats and the read deadline ---------------------------------------------------

    def _restart_heartbeat(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
            self._heartbeat_timer = None
        if self.heartbeat_interval > 0:
            self._heartbeat_timer = self.loop.call_later(self.heartbeat_interval / 1000,
                                                         self._heartbeat)
        self._arm_deadline()

    def _heartbeat(self) -> None:
        self._heartbeat_timer = None
        if self._closed or self.heartbeat_interval <= 0:
            return
        self._write(HEARTBEAT_FRAME)
        self._heartbeat_timer = self.loop.call_later(self.heartbeat_interval / 1000,
                                                     self._heartbeat)

    def _deadline_span(self) -> float:
        factor = 2 if not self.youzan else 3
        return factor * self.heartbeat_interval / 1000

    def _arm_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.heartbeat_interval > 0:
            self._deadline_timer = self.loop.call_at(self._last_read + self._deadline_span(),
                                                     self._check_deadline)

    def _check_deadline(self) -> None:
        self._deadline_timer = None
        if self._closed or self.heartbeat_interval <= 0:
            return
        due = self._last_read + self._deadline_span()
        if self._held_on is not None:  # the server is not reading: no read deadline runs
            due = max(due, self.loop.time() + self._deadline_span())
        elif self.loop.time() >= due - 0.001:
            log.debug("%r: no command for %.1fs, closing", self, self._deadline_span())
            self.close()
            return
        self._deadline_timer = self.loop.call_at(due, self._check_deadline)

    # -- message delivery ---------------------------------------------------------------------

    def _deliver(self, entry: Entry) -> None:
        if self._closed:
            return
        msg = entry.msg
        if self.youzan:
            msg_id = _ID.pack(msg.internal_id, msg.trace_id)
        else:
            msg_id = b"%016x" % msg.internal_id
        layout = self.layout
        if layout.ext and msg.ext is not None:
            frame = encode_message(msg.timestamp, entry.attempts, msg_id, msg.body, layout,
                                   ext_version=4, ext=msg.ext, queue_offset=msg.queue_offset,
                                   raw_size=msg.raw_size)
        else:
            frame = encode_message(msg.timestamp, entry.attempts, msg_id, msg.body, layout,
                                   queue_offset=msg.queue_offset, raw_size=msg.raw_size)
        self._write(frame)

    # -- shared checks ----------------------------------------------------------------------

    def _check_auth(self, cmd: str, topic: str, channel: str) -> None:
        if self.node.auth is None:
            return
        if self.identity is None:
            raise fatal("E_AUTH_FIRST", f"AUTH required before {cmd}")
        if not self.identity.allows(topic, channel):
            raise fatal("E_UNAUTHORIZED",
                        f"AUTH failed for {cmd} on {go_quote(topic)} {go_quote(channel)}")

    def _writable(self, p: PartitionInfo) -> None:
        """youzan's write preconditions, checked once the body is read (non-fatal)."""
        if self.node.exiting:  # a graceful leave under way (failover_sigterm_*.txt)
            raise nonfatal("E_PUB_FAILED", "exiting")
        if not p.serving(self.node.node_id):
            raise nonfatal("E_FAILED_ON_NOT_LEADER")
        if not p.writable:
            raise nonfatal("E_FAILED_ON_NOT_WRITABLE")

    # -- IDENTIFY -------------------------------------------------------------------------------

    def cmd_identify(self, params: list[bytes]) -> Generator[int, Any, bytes | None]:
        if self.client_state != STATE_INIT:
            raise fatal("E_INVALID", "cannot IDENTIFY in current state")
        size = yield READ_INT32
        max_body = self.opts.max_body_size
        if size > max_body:
            raise fatal("E_BAD_BODY", f"IDENTIFY body too big {size} > {max_body}")
        if size <= 0:
            raise fatal("E_BAD_BODY", f"IDENTIFY invalid body size {size}")
        body = yield size
        try:
            data = ident.decode_identify(body, youzan=self.youzan)
        except ValueError:
            raise fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        try:
            self._apply_identify(data)
        except ValueError as exc:
            raise fatal("E_BAD_BODY", f"IDENTIFY {exc}") from None
        if not data.feature_negotiation:
            return OK
        opts = self.opts
        tls = self.node.tls_context is not None and data.tls_v1
        deflate = opts.deflate and data.deflate
        snappy = opts.snappy and data.snappy
        if self.youzan:
            # youzan computes the fallback 6 and then overwrites it (docs/protocol.md §3.3)
            level = min(data.deflate_level, opts.max_deflate_level) if deflate else 0
        else:
            level = data.deflate_level if deflate and data.deflate_level > 0 else 6
            level = min(level, opts.max_deflate_level)
        if deflate and snappy:
            raise fatal("E_IDENTIFY_FAILED", "cannot enable both deflate and snappy compression")
        answer: dict[str, Any] = {
            "max_rdy_count": opts.max_rdy_count,
            "version": self.node.version,
            "max_msg_timeout": opts.max_msg_timeout,
            "msg_timeout": self.msg_timeout,
            "tls_v1": tls,
            "deflate": deflate,
            "deflate_level": level,
            "max_deflate_level": opts.max_deflate_level,
            "snappy": snappy,
            "sample_rate": self.sample_rate,
            "auth_required": self.node.auth is not None,
            "output_buffer_size": self.output_buffer_size,
            "output_buffer_timeout": self.output_buffer_timeout,
        }
        if self.youzan and self.desired_tag:
            answer["desired_tag"] = self.desired_tag
        self._respond(json.dumps(answer, separators=(",", ":")).encode())
        if tls:
            self._start_tls(snappy, deflate, level)
        elif snappy or deflate:
            self._compress(snappy, deflate, level)
        return None

    def _apply_identify(self, data: ident.IdentifyData) -> None:
        limits = self.node.identify_limits
        hb = ident.heartbeat(data.heartbeat_interval, self.heartbeat_interval, limits)
        if self.youzan:
            size = ident.youzan_output_buffer_size(data.output_buffer_size,
                                                   self.output_buffer_size, limits)
            timeout = ident.youzan_output_buffer_timeout(data.output_buffer_timeout,
                                                         self.output_buffer_timeout, limits)
        else:
            size, timeout = ident.classic_output_buffer(
                data.output_buffer_size, data.output_buffer_timeout, self.output_buffer_size,
                self.output_buffer_timeout, limits)
        rate = ident.sample_rate(data.sample_rate)
        msg_timeout = ident.msg_timeout(data.msg_timeout, self.msg_timeout, limits)
        tag = self.desired_tag
        if self.youzan and data.desired_tag:
            tag = ident.desired_tag(data.desired_tag)
        self.client_id = data.client_id
        self.hostname = data.hostname
        self.user_agent = data.user_agent
        self.heartbeat_interval = hb
        self.output_buffer_size, self.output_buffer_timeout = size, timeout
        self.sample_rate = rate
        self.msg_timeout = msg_timeout
        self.desired_tag = tag
        if self.youzan:
            self.extend_support = self.extend_support or data.extend_support
            if data.output_buffer_size > 0:
                self.asked_buffer_size = size
            spec = data.ext_filter
            self.ext_filter_spec = dict(spec or {})
            if spec and spec.get("type"):
                try:
                    self.ext_filter = ExtFilter(spec)
                except Exception as exc:  # nsqd logs a bad filter and goes on without it
                    log.info("%r: ext filter %r ignored: %s", self, spec, exc)
        if not self._identified:
            # the message pump takes only the first IDENTIFY's heartbeat interval
            self._identified = True
            self._restart_heartbeat()

    def _compress(self, snappy: bool, deflate: bool, level: int) -> None:
        """Switch the byte stream to snappy or deflate; the extra OK is the first frame in it."""
        self._flush()  # the IDENTIFY answer is still plain
        if snappy:
            self._stream = SnappyStream()
            self.snappy = True
            self._respond(OK)
        if deflate:
            try:
                self._stream = DeflateStream.go_level(level)
            except ValueError as exc:
                raise fatal("E_IDENTIFY_FAILED", f"IDENTIFY failed {exc}") from None
            self.deflate = True
            self._respond(OK)
        early = self.reader.take_buffered()  # sent after IDENTIFY, hence already compressed
        if early and self._stream is not None:
            self.reader.feed(self._stream.decompress(early))

    def _start_tls(self, snappy: bool, deflate: bool, level: int) -> None:
        self._flush()  # the IDENTIFY answer goes out in the clear
        transport = self.transport
        assert transport is not None
        transport.pause_reading()  # the ClientHello must reach the TLS layer, not us
        self._suspended = True
        task = self.loop.create_task(self._upgrade_tls(transport, snappy, deflate, level))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _upgrade_tls(self, transport: asyncio.Transport, snappy: bool, deflate: bool,
                           level: int) -> None:
        context = self.node.tls_context
        assert context is not None
        context.sslobject_class = _AlertingSSLObject  # refusals reach the client as alerts
        try:
            upgraded = await self.loop.start_tls(transport, self, context, server_side=True,
                                                 ssl_handshake_timeout=5.0)
        except Exception as exc:  # a failed handshake ends the connection
            log.debug("%r: TLS handshake failed: %s", self, exc)
            self._suspended = False
            self.abort()
            return
        if upgraded is None or self._closed:
            self._suspended = False
            self.abort()
            return
        self.transport = upgraded
        self.tls = True
        self._suspended = False
        self._respond(OK)
        try:
            if snappy or deflate:
                self._compress(snappy, deflate, level)
        except ClientError as exc:
            self._error(exc)
            return
        self._flush()
        self._process()

    # -- AUTH -----------------------------------------------------------------------------------

    def cmd_auth(self, params: list[bytes]) -> Generator[int, Any, bytes | None]:
        if self.client_state != STATE_INIT:
            raise fatal("E_INVALID", "cannot AUTH in current state")
        if len(params) != 1:
            raise fatal("E_INVALID", "AUTH invalid number of parameters")
        size = yield READ_INT32
        max_body = self.opts.max_body_size
        if size > max_body:
            raise fatal("E_BAD_BODY", f"AUTH body too big {size} > {max_body}")
        if size <= 0:
            raise fatal("E_BAD_BODY", f"AUTH invalid body size {size}")
        secret = yield size
        youzan = self.youzan
        if self.identity is not None:
            raise fatal("E_INVALID", "AUTH Already set" if youzan else "AUTH already set")
        table = self.node.auth
        if table is None:
            raise fatal("E_AUTH_DISABLED", "AUTH Disabled" if youzan else "AUTH disabled")
        identity = table.lookup(_text(secret))
        if identity is None:
            raise fatal("E_AUTH_FAILED", "AUTH failed")
        if not identity.authorizations:
            raise fatal("E_UNAUTHORIZED", "AUTH No authorizations found" if youzan
                        else "AUTH no authorizations found")
        self.identity = identity
        answer = {"identity": identity.identity, "identity_url": identity.identity_url,
                  "permission_count": len(identity.authorizations)}
        return json.dumps(answer, separators=(",", ":")).encode()

    # -- subscribing ----------------------------------------------------------------------------

    def cmd_sub(self, params: list[bytes]) -> bytes:
        if self.youzan:
            return self._youzan_sub(params, b"SUB")
        return self._classic_sub(params)

    def cmd_sub_ordered(self, params: list[bytes]) -> bytes:
        return self._youzan_sub(params, b"SUB_ORDERED")

    def cmd_sub_advanced(self, params: list[bytes]) -> bytes:
        return self._youzan_sub(params, b"SUB_ADVANCED")

    def _sub_common(self, params: list[bytes]) -> tuple[str, str]:
        if self.client_state != STATE_INIT:
            raise fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(params) < 3:
            raise fatal("E_INVALID", "SUB insufficient number of parameters")
        topic, channel = _text(params[1]), _text(params[2])
        if not valid_name(params[1]):
            raise fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(params[1])} is not valid")
        if not valid_name(params[2]):
            raise fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(params[2])} is not valid")
        return topic, channel

    def _youzan_sub(self, params: list[bytes], cmd: bytes) -> bytes:
        start: tuple[str, int] | None = None
        if cmd == b"SUB_ADVANCED" and len(params) > 4 and params[4]:
            start = _consume_offset(params[4])
        topic, channel_name = self._sub_common(params)
        partition = -1
        if len(params) == 4:  # youzan parses the partition only from exactly 4 tokens
            try:
                partition = go_atoi(params[3])
            except GoParseError as exc:
                raise fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        self._check_auth("SUB", topic, channel_name)
        if partition == -1:
            partition = self.node.default_partition(topic)
        p = self.node.held_partition(topic, partition)
        info = self.state.topics.get(topic)
        if p is None or info is None:
            raise fatal("E_TOPIC_NOT_EXIST")
        ordered = cmd == b"SUB_ORDERED"
        if info.ordered and not ordered:
            raise fatal("E_SUB_ORDER_IS_MUST", "this topic is configured only allow ordered sub")
        if info.ext:
            if not self.opts.allow_sub_ext_compatible and not self.extend_support:
                raise fatal("E_SUB_EXTEND_NEED",
                            "this topic is extended and should identify as extend support.")
        elif self.extend_support:
            raise fatal("E_SUB_EXTEND_FORBIDDON",
                        "this topic is not extended and should not identify as extend support.")
        if not p.serving(self.node.node_id):
            raise fatal("E_FAILED_ON_NOT_LEADER")
        if p.refuses_sub:  # the leader's channels are disabled (channel.AddClient refuses)
            raise fatal("E_FAILED_ON_NOT_WRITABLE")
        if info.disable_channel_auto_create and not isinstance(p.channels.get(channel_name),
                                                                Channel):
            raise fatal("E_SUB_CHANNEL_NOT_REGISTERED", "channel is not registered under topic.")
        channel = self.node.channel(p, info, channel_name)
        if not info.ext and self.desired_tag:
            self.desired_tag = ""  # tags only mean something on ext topics
        self._subscribe(p, channel, extend=self.extend_support and info.ext,
                        detail=cmd != b"SUB")
        if ordered:
            if self.sample_rate != 0:
                raise fatal("E_INVALID", "order consume is not allowed while sample rate is not 0")
            channel.set_ordered(True)
        if start is not None and p.log.end_offset == 0 and start[0] != "special":
            # measured: a partition never written to has no commit log to search yet (as
            # its /channel/setoffset answers)
            raise fatal("E_INVALID", "commit log end of file")
        if start is not None and len(channel.consumers) <= 1:
            try:
                channel.reset_to(start_index(channel, *start))
            except ValueError as exc:
                raise fatal("E_INVALID", str(exc)) from None
        return OK

    def _classic_sub(self, params: list[bytes]) -> bytes:
        topic, channel_name = self._sub_common(params)
        self._check_auth("SUB", topic, channel_name)
        p = self.node.classic_partition(topic)
        channel = self.node.channel(p, None, channel_name)
        self._subscribe(p, channel, extend=False, detail=False)
        return OK

    def _subscribe(self, p: PartitionInfo, channel: Channel, *, extend: bool,
                   detail: bool) -> None:
        consumer = Consumer(self._deliver, msg_timeout=self.msg_timeout / 1000,
                            tag=self.desired_tag, youzan=self.youzan,
                            ext_filter=self.ext_filter, sample_rate=self.sample_rate)
        channel.add(consumer)
        self.consumer = consumer
        self.channel = channel
        self.partition = p
        self.client_state = STATE_SUBSCRIBED
        if self.youzan:
            self.layout = MessageLayout(youzan=True, ext=extend, detail=detail)

    # -- consuming ------------------------------------------------------------------------------

    def cmd_rdy(self, params: list[bytes]) -> None:
        if self.client_state == STATE_CLOSING:
            return None
        if self.client_state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if len(params) > 1:
            try:
                count = as_int64(go_base10(params[1]))
            except GoParseError:
                raise fatal("E_INVALID", b"RDY could not parse count " + params[1]) from None
        max_rdy = self.opts.max_rdy_count
        if count < 0 or count > max_rdy:
            raise fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        assert self.consumer is not None and self.channel is not None
        self.consumer.rdy = count
        self.channel.schedule_pump()
        return None

    def _message_key(self, params: list[bytes], cmd: str, wanted: int) -> tuple[int, bytes]:
        """The in-flight key of a FIN/REQ/TOUCH id, with the state and shape checks."""
        if self.client_state not in (STATE_SUBSCRIBED, STATE_CLOSING):
            raise fatal("E_INVALID", f"cannot {cmd} in current state")
        if len(params) < wanted:
            raise fatal("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = params[1]
        if self.youzan:
            if len(msg_id) != 16:
                raise fatal("E_INVALID", "Invalid Message ID")
            key = int.from_bytes(msg_id[:8], "big")
            return key, msg_id
        if len(msg_id) != 16:
            raise fatal("E_INVALID", "invalid message ID")
        try:
            return int(msg_id, 16), msg_id
        except ValueError:
            return -1, msg_id

    def _failed_text(self, cmd: str, msg_id: bytes, reason: str) -> bytes:
        if self.youzan:
            return f"{cmd} {go_bytes(msg_id)} failed {reason}".encode()
        return cmd.encode() + b" " + msg_id + f" failed {reason}".encode()

    def cmd_fin(self, params: list[bytes]) -> None:
        key, msg_id = self._message_key(params, "FIN", 2)
        if self.youzan and as_int64(key) <= 0:
            raise fatal("E_INVALID", "Invalid Message ID")
        assert self.consumer is not None and self.channel is not None
        if self.youzan:
            p = self.partition
            if p is None or not p.serving(self.node.node_id):
                raise fatal("E_FAILED_ON_NOT_LEADER")
        if not self.channel.finish(self.consumer, key):
            reason = ("ErrType:7 ErrCode:0 : Message ID not in flight" if self.youzan
                      else "ID not in flight")
            raise nonfatal("E_FIN_FAILED", self._failed_text("FIN", msg_id, reason))
        return None

    def cmd_req(self, params: list[bytes]) -> None:
        key, msg_id = self._message_key(params, "REQ", 3)
        try:
            delay_ms = as_int64(go_base10(params[2]))
        except GoParseError:
            if self.youzan:
                text = b"REQ could not parse timeout " + msg_id + b", " + params[2]
            else:
                text = b"REQ could not parse timeout " + params[2]
            raise fatal("E_INVALID", text) from None
        delay_ms = max(0, min(delay_ms, self.opts.max_req_timeout))
        assert self.consumer is not None and self.channel is not None
        channel = self.channel
        if self.youzan and channel.ordered and delay_ms > 0:
            return None  # ordered channels ignore REQ delays (docs/protocol.md §3.6)
        if not channel.requeue(self.consumer, key, delay_ms / 1000):
            reason = "Message ID not in flight" if self.youzan else "ID not in flight"
            raise nonfatal("E_REQ_FAILED", self._failed_text("REQ", msg_id, reason))
        return None

    def cmd_touch(self, params: list[bytes]) -> None:
        key, msg_id = self._message_key(params, "TOUCH", 2)
        assert self.consumer is not None and self.channel is not None
        if not self.channel.touch(self.consumer, key):
            reason = "Message ID not in flight" if self.youzan else "ID not in flight"
            raise nonfatal("E_TOUCH_FAILED", self._failed_text("TOUCH", msg_id, reason))
        return None

    def cmd_cls(self, params: list[bytes]) -> bytes:
        if self.client_state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self.client_state = STATE_CLOSING
        if self.consumer is not None:
            self.consumer.rdy = 0
            self.consumer.closing = True
        return b"CLOSE_WAIT"

    def cmd_nop(self, params: list[bytes]) -> None:
        return None

    # -- youzan's standalone-only command ---------------------------------------------------

    def cmd_internal_create_topic(self, params: list[bytes]) -> None:
        if len(params) < 3:
            raise fatal("E_INVALID", "CREATE_TOPIC insufficient number of parameters")
        if not valid_name(params[1]):
            raise fatal("E_BAD_TOPIC", f"topic name {go_quote(params[1])} is not valid")
        try:
            partition = go_atoi(params[2])
        except GoParseError as exc:
            raise fatal("E_BAD_PARTITION", f"topic partition is not valid: {exc}") from None
        self._check_auth("CREATE_TOPIC", _text(params[1]), "")
        if partition < 0:
            raise fatal("E_BAD_PARTITION", "partition should not less than 0")
        if len(params) >= 4:
            try:
                go_parse_bool(params[3])
            except GoParseError as exc:
                raise fatal("E_BAD_EXT", f"topic ext is not valid: {exc}") from None
        raise nonfatal("E_CREATE_TOPIC_FAILED",
                       "CREATE_TOPIC is not allowed here while cluster feature enabled.")

    # -- node events ------------------------------------------------------------------------

    def subscribed_to(self, topic: str, partition: int | None = None) -> bool:
        p = self.partition
        return (p is not None and p.topic == topic
                and (partition is None or p.partition == partition))


def _consume_offset(token: bytes) -> tuple[str, int]:
    """youzan's ``ConsumeOffset.FromBytes`` (a SUB_ADVANCED start position)."""
    parts = token.split(b":")
    if len(parts) != 2 or _text(parts[0]) not in _START_KINDS:
        raise fatal("E_INVALID", b"invalid consume offset:" + token)
    try:
        value = go_atoi(parts[1])
    except GoParseError as exc:
        text = str(exc).replace("strconv.Atoi", "strconv.ParseInt")
        raise fatal("E_INVALID", text) from None
    return _text(parts[0]), value


YOUZAN_HANDLERS: Final[dict[bytes, Handler]] = {
    b"IDENTIFY": NsqdConnection.cmd_identify,
    b"FIN": NsqdConnection.cmd_fin,
    b"RDY": NsqdConnection.cmd_rdy,
    b"REQ": NsqdConnection.cmd_req,
    b"PUB": NsqdConnection.cmd_pub,
    b"PUB_TRACE": NsqdConnection.cmd_pub_trace,
    b"PUB_EXT": NsqdConnection.cmd_pub_ext,
    b"MPUB": NsqdConnection.cmd_mpub,
    b"MPUB_TRACE": NsqdConnection.cmd_mpub_trace,
    b"MPUB_EXT": NsqdConnection.cmd_mpub_ext,
    b"NOP": NsqdConnection.cmd_nop,
    b"TOUCH": NsqdConnection.cmd_touch,
    b"SUB": NsqdConnection.cmd_sub,
    b"SUB_ADVANCED": NsqdConnection.cmd_sub_advanced,
    b"SUB_ORDERED": NsqdConnection.cmd_sub_ordered,
    b"CLS": NsqdConnection.cmd_cls,
    b"AUTH": NsqdConnection.cmd_auth,
    b"INTERNAL_CREATE_TOPIC": NsqdConnection.cmd_internal_create_topic,
}

CLASSIC_HANDLERS: Final[dict[bytes, Handler]] = {
    b"IDENTIFY": NsqdConnection.cmd_identify,
    b"FIN": NsqdConnection.cmd_fin,
    b"RDY": NsqdConnection.cmd_rdy,
    b"REQ": NsqdConnection.cmd_req,
    b"PUB": NsqdConnection.cmd_classic_pub,
    b"MPUB": NsqdConnection.cmd_classic_mpub,
    b"DPUB": NsqdConnection.cmd_classic_dpub,
    b"NOP": NsqdConnection.cmd_nop,
    b"TOUCH": NsqdConnection.cmd_touch,
    b"SUB": NsqdConnection.cmd_sub,
    b"CLS": NsqdConnection.cmd_cls,
    b"AUTH": NsqdConnection.cmd_auth,
}
