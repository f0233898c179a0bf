"""Incremental decoding of the server-to-client stream (docs/protocol.md §3.1, §4).

``FrameReader.feed(data)`` takes whatever bytes the socket produced and returns every
complete frame in them; a partial frame is kept until the rest arrives, so any split of the
stream yields the same frames. This is the client's hot path: one ``unpack_from`` per frame,
bodies sliced once from the received chunk, one object per message, no per-byte work.

Which optional blocks a message frame holds is not written in the frame: it follows from the
connection (classic or youzan ids, IDENTIFY ``extend_support``, and whether the subscription was
SUB_ORDERED/SUB_ADVANCED). The connection tells the reader through ``MessageLayout``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from struct import Struct
from typing import Any, Final, TypeVar, Union

try:  # mypyc's class options (setup.py compiles this module); a no-op on the pure path
    from mypy_extensions import mypyc_attr
except ImportError:  # pragma: no cover - mypy_extensions comes with mypy, not with smartnsq
    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[Any], Any]:  # type: ignore[misc]
        return lambda cls: cls

from ..errors import ProtocolError
from .diagnose import describe_start, looks_like_http, nsqd_hint_for_http
from .validate import TRACE_ID_HEADER

FRAME_RESPONSE: Final = 0
FRAME_ERROR: Final = 1
FRAME_MESSAGE: Final = 2

HEARTBEAT_PAYLOAD: Final = b"_heartbeat_"
OK: Final = b"OK"
CLOSE_WAIT: Final = b"CLOSE_WAIT"

DEFAULT_MAX_FRAME_SIZE: Final = 6 * 1024 * 1024  # above max_body_size; a real frame never is

_HDR = Struct(">ii")
_HDR_MSG = Struct(">iiqH")  # size, type, timestamp, attempts: one call per message frame
_U16 = Struct(">H")
_U64 = Struct(">Q")
_DETAIL = Struct(">QI")
_ID = Struct(">QQ")

_T = TypeVar("_T")

_PARTITION_SHIFT: Final = 50
_PARTITION_MASK: Final = 0x3FF


def partition_of(internal_id: int) -> int:
    """The partition a youzan internal id belongs to: ``(id >> 50) & 0x3FF``."""
    return (internal_id >> _PARTITION_SHIFT) & _PARTITION_MASK


@mypyc_attr(allow_interpreted_subclasses=True)  # smartnsq.Message extends it
class MessageFrame:
    """One delivered message, as decoded from a message frame.

    ``id`` is the raw 16-byte message id, to be echoed unchanged in FIN/REQ/TOUCH. On youzan
    nodes it is an 8-byte internal id and an 8-byte trace id; on classic nodes 16 ASCII hex
    characters. ``ext`` is the raw ext header (JSON text for ``ext_version`` 4) and
    ``queue_offset``/``raw_size`` come from the detail block; each is ``None`` when the
    subscription does not carry it.
    """

    __slots__ = ("_headers", "attempts", "body", "ext", "ext_version", "id", "queue_offset",
                 "raw_size", "timestamp", "youzan")

    _headers: dict[str, str]  # set by the first ``headers`` access

    def __init__(self, timestamp: int, attempts: int, id: bytes, body: bytes,
                 ext_version: int = 0, ext: bytes | None = None,
                 queue_offset: int | None = None, raw_size: int | None = None,
                 youzan: bool = True) -> None:
        self.timestamp = timestamp
        self.attempts = attempts
        self.id = id
        self.body = body
        self.ext_version = ext_version
        self.ext = ext
        self.queue_offset = queue_offset
        self.raw_size = raw_size
        self.youzan = youzan

    @property
    def internal_id(self) -> int:
        """Youzan: the 64-bit internal id; classic: the hex GUID read as an integer."""
        if self.youzan:
            return int(_U64.unpack_from(self.id)[0])
        try:
            return int(self.id, 16)
        except ValueError:
            raise ProtocolError(f"message id {bytes(self.id)[:16]!r} is not hex "
                                "(classic nodes send 16 hex digits)") from None

    @property
    def trace_id(self) -> int | None:
        """The producer's trace id (0 when none was given); ``None`` on classic nodes."""
        if self.youzan:
            return int(_U64.unpack_from(self.id, 8)[0])
        return None

    @property
    def partition(self) -> int | None:
        """The partition the message was read from; ``None`` on classic nodes."""
        if self.youzan:
            return partition_of(int(_U64.unpack_from(self.id)[0]))
        return None

    @property
    def headers(self) -> dict[str, str]:
        """The ext JSON header as a dict (empty when the message has none), without the
        server's ``##trace_id`` key: that is ``trace_id`` (``ext`` keeps the bytes as stored).

        Parsed on first access (not at decode: most handlers never look) and kept: every
        access returns the same dict."""
        try:
            return self._headers
        except AttributeError:  # the slot is left unset at decode time: no cost per message
            pass
        headers = self._headers = self._parse_headers()
        return headers

    def _parse_headers(self) -> dict[str, str]:
        if self.ext_version != 4 or not self.ext:
            return {}
        try:
            value = json.loads(self.ext)
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise ProtocolError(f"ext header is not JSON: {self.ext[:64]!r}") from exc
        if not isinstance(value, dict):
            raise ProtocolError(f"ext header is not a JSON object: {self.ext[:64]!r}")
        return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in value.items()
                if k != TRACE_ID_HEADER}

    def __repr__(self) -> str:
        ident = (f"internal_id={self.internal_id} trace_id={self.trace_id}"
                 if self.youzan else f"id={self.id.decode('ascii', 'replace')}")
        return (f"<{type(self).__name__} {ident} attempts={self.attempts} "
                f"body={self.body[:32]!r}{'...' if len(self.body) > 32 else ''}>")


class Response:
    """A response frame other than a heartbeat (``OK``, JSON, the traced-publish answer...)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        return f"Response({self.data!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Response) and other.data == self.data

    __hash__ = None  # type: ignore[assignment]


class ErrorFrame:
    """An error frame; ``payload`` is ``CODE DESCRIPTION`` (see ``smartnsq.errors``)."""

    __slots__ = ("payload",)

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def __repr__(self) -> str:
        return f"ErrorFrame({self.payload!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ErrorFrame) and other.payload == self.payload

    __hash__ = None  # type: ignore[assignment]


class Heartbeat:
    """The ``_heartbeat_`` response; answer with NOP."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "HEARTBEAT"


HEARTBEAT: Final = Heartbeat()

Frame = Union[MessageFrame, Response, ErrorFrame, Heartbeat]  # noqa: UP007 - runtime alias on 3.10


@dataclass(frozen=True)
class MessageLayout:
    """Which optional blocks follow the 26-byte message header (docs/protocol.md §4.4).

    ``youzan`` - ids are binary (internal id + trace id) rather than ASCII hex;
    ``ext`` - an ext block (version, length, JSON) follows: the connection IDENTIFYed with
    ``extend_support: true``; ``detail`` - a 12-byte queue offset + raw size follows: the
    subscription is SUB_ORDERED or SUB_ADVANCED.
    """

    youzan: bool = True
    ext: bool = False
    detail: bool = False

    @classmethod
    def for_subscription(cls, *, youzan: bool, extend_support: bool,
                         command: str) -> MessageLayout:
        detail = command in ("SUB_ORDERED", "SUB_ADVANCED")
        if not youzan and (extend_support or detail):
            raise ValueError("classic nodes have neither ext nor detail blocks")
        return cls(youzan=youzan, ext=extend_support, detail=detail)


CLASSIC_LAYOUT: Final = MessageLayout(youzan=False)
YOUZAN_LAYOUT: Final = MessageLayout()


class FrameReader:
    """Sans-I/O decoder of server frames.

    ``feed()`` returns the frames completed by ``data``. A frame whose declared size is below
    4 or above ``max_frame_size``, an unknown frame type, or a message frame whose blocks
    overrun it raises ``ProtocolError``; after that the reader refuses further input, since
    the stream can no longer be trusted.
    """

    __slots__ = ("_broken", "_layout", "_max", "_message_class", "_need", "_pending")

    def __init__(self, layout: MessageLayout = YOUZAN_LAYOUT, *,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 message_class: type[MessageFrame] = MessageFrame) -> None:
        self._layout = layout
        self._max = max_frame_size
        self._message_class = message_class
        self._pending = bytearray()
        self._need = 0
        self._broken: ProtocolError | None = None

    @property
    def layout(self) -> MessageLayout:
        return self._layout

    @layout.setter
    def layout(self, layout: MessageLayout) -> None:
        self._layout = layout

    @property
    def buffered(self) -> int:
        """Bytes held for a frame not yet complete."""
        return len(self._pending)

    def feed(self, data: bytes) -> list[Frame]:
        return self._feed(data, self._decode)

    def _feed(self, data: bytes, decode: Callable[[bytes], list[_T]]) -> list[_T]:
        if self._broken is not None:
            raise self._broken
        pending = self._pending
        if pending:
            pending += data
            if len(pending) < self._need:
                return []
            data = bytes(pending)
            pending.clear()
        try:
            return decode(data)
        except ProtocolError as exc:
            self._broken = exc
            self._pending = bytearray()
            raise

    def _fail(self, reason: str) -> ProtocolError:
        return ProtocolError(reason)

    def _bad_size(self, size: int, start: bytes) -> str:
        """Why a frame's size is refused, and what the bytes look like instead (an HTTP
        answer says which port this probably is)."""
        if looks_like_http(start[:5]):
            return nsqd_hint_for_http(start)
        return (f"frame size {size} outside 4..{self._max}: the stream starts with "
                f"{describe_start(start)}")

    def _decode(self, data: bytes) -> list[Frame]:
        out: list[Frame] = []
        append = out.append
        n = len(data)
        pos = 0
        max_size = self._max
        unpack_msg = _HDR_MSG.unpack_from
        unpack_hdr = _HDR.unpack_from
        layout = self._layout
        plain = not layout.ext and not layout.detail  # no optional block: decode inline
        youzan = layout.youzan
        has_ext = layout.ext
        has_detail = layout.detail
        unpack_detail = _DETAIL.unpack_from
        cls = self._message_class
        while n - pos >= 8:
            if n - pos >= 18:
                size, ftype, ts, attempts = unpack_msg(data, pos)
            else:
                size, ftype = unpack_hdr(data, pos)
                ts = attempts = 0
            if size < 4 or size > max_size:
                raise self._fail(self._bad_size(size, data[pos:pos + 256]))
            end = pos + 4 + size
            if end > n:
                break
            if ftype == 2:
                if size < 30:
                    raise self._fail(f"message frame of {size - 4} bytes is shorter than 26")
                if plain:
                    if youzan:
                        append(cls(ts, attempts, data[pos + 18:pos + 34], data[pos + 34:end]))
                    else:
                        append(cls(ts, attempts, data[pos + 18:pos + 34], data[pos + 34:end],
                                   0, None, None, None, False))
                else:
                    # the optional blocks, inline: this is the ordered/ext consumer's hot path
                    p = pos + 34
                    ext_version = 0
                    ext: bytes | None = None
                    offset: int | None = None
                    raw_size: int | None = None
                    if has_ext:
                        if p >= end:
                            raise self._fail("message frame ends before its ext block")
                        ext_version = data[p]
                        p += 1
                        if ext_version:
                            if p + 2 > end:
                                raise self._fail("message frame ends inside its ext length")
                            length = (data[p] << 8) | data[p + 1]
                            p += 2
                            if p + length > end:
                                raise self._fail(
                                    f"ext block of {length} bytes overruns the frame")
                            ext = data[p:p + length]
                            p += length
                    if has_detail:
                        if p + 12 > end:
                            raise self._fail("message frame ends inside its detail block")
                        offset, raw_size = unpack_detail(data, p)
                        p += 12
                    append(cls(ts, attempts, data[pos + 18:pos + 34], data[p:end], ext_version,
                               ext, offset, raw_size, youzan))
            elif ftype == 0:
                payload = data[pos + 8:end]
                append(HEARTBEAT if payload == HEARTBEAT_PAYLOAD else Response(payload))
            elif ftype == 1:
                append(ErrorFrame(data[pos + 8:end]))
            else:
                raise self._fail(f"unknown frame type {ftype}")
            pos = end
        if pos < n:
            self._keep_tail(data, pos)
        return out

    def _keep_tail(self, data: bytes, pos: int) -> None:
        """Hold the start of a frame not complete yet (``data[pos:]``)."""
        self._pending += data[pos:]
        if len(data) - pos >= 4:
            self._need = 4 + int.from_bytes(data[pos:pos + 4], "big", signed=True)
            if not 8 <= self._need <= self._max + 4:
                raise self._fail(f"frame size {self._need - 4} outside 4..{self._max}")
        else:
            self._need = 8

    def _rejected(self, frame: bytes) -> ProtocolError:
        """The error ``_decode`` words for a message frame that does not parse."""
        try:
            self._decode(frame)
        except ProtocolError as exc:
            return exc
        return self._fail("message frame does not parse")  # pragma: no cover - never reached



# -- encoding frames (the server side: dev cluster, tests, benchmarks) ---------------------

def encode_frame(frame_type: int, payload: bytes) -> bytes:
    return _HDR.pack(4 + len(payload), frame_type) + payload


def encode_response(data: bytes) -> bytes:
    return encode_frame(FRAME_RESPONSE, data)


def encode_error(payload: bytes) -> bytes:
    return encode_frame(FRAME_ERROR, payload)


HEARTBEAT_FRAME: Final = encode_response(HEARTBEAT_PAYLOAD)
_HDR_MSG_ENC = Struct(">iiqH")


def encode_message(timestamp: int, attempts: int, msg_id: bytes, body: bytes,
                   layout: MessageLayout = YOUZAN_LAYOUT, *, ext_version: int = 0,
                   ext: bytes | None = None, queue_offset: int = 0, raw_size: int = 0) -> bytes:
    """Build a message frame in ``layout`` (the inverse of ``FrameReader``)."""
    if len(msg_id) != 16:
        raise ValueError("message ids are 16 bytes")
    parts = [msg_id]
    if layout.ext:
        if ext_version == 0:
            parts.append(b"\x00")
        else:
            raw = ext or b""
            parts.append(bytes((ext_version,)) + _U16.pack(len(raw)) + raw)
    if layout.detail:
        parts.append(_DETAIL.pack(queue_offset, raw_size))
    parts.append(body)
    rest = b"".join(parts)
    return _HDR_MSG_ENC.pack(4 + 10 + len(rest), FRAME_MESSAGE, timestamp, attempts) + rest


def youzan_message_id(internal_id: int, trace_id: int = 0) -> bytes:
    return _ID.pack(internal_id, trace_id)
