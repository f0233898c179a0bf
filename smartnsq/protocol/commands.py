"""Encoders for every command a client sends (docs/protocol.md §3.1-3.8).

Each function validates its arguments, then returns the exact bytes for the wire. The
``*_unchecked`` publish encoders at the end skip that validation: they are for a caller that
already validated the same values once per publish (the Producer checks topic, partition,
bodies, trace ids and headers before routing, and would otherwise pay for it twice per
attempt); everyone else should use the checked ones. Lines use
single spaces and no trailing space: the server splits on single spaces and counts tokens, so
an extra space changes the meaning of a command. Message ids in FIN/REQ/TOUCH are the 16 raw
bytes received, echoed unchanged, because the server slices them at fixed offsets.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from struct import Struct
from typing import Literal

from ..errors import InvalidArgument
from . import validate as v
from .numbers import check_int

MAGIC_V2 = b"  V2"

_U16 = Struct(">H")
_U32 = Struct(">I")
_U64 = Struct(">Q")
_U32U32 = Struct(">II")
_U32U64 = Struct(">IQ")

NOP = b"NOP\n"
CLS = b"CLS\n"

StartKind = Literal["timestamp", "virtual_queue", "msgcount", "special"]


@dataclass(frozen=True)
class StartPosition:
    """Where a SUB_ADVANCED subscription starts (docs/protocol.md §3.5).

    Build with the class methods; ``token()`` is the wire form ``kind:value``.
    """

    kind: StartKind
    value: int

    def __post_init__(self) -> None:
        if self.kind not in ("timestamp", "virtual_queue", "msgcount", "special"):
            raise InvalidArgument("start position", "kind must be timestamp, virtual_queue, "
                                  "msgcount or special", self.kind)
        if self.kind == "special":
            if self.value != -1:
                raise InvalidArgument("start position", "special only allows -1 (end)",
                                      self.value)
        else:
            v.check_uint64(f"start position {self.kind}", self.value)

    @classmethod
    def timestamp(cls, unix_seconds: int) -> StartPosition:
        return cls("timestamp", int(unix_seconds))

    @classmethod
    def queue_offset(cls, offset: int) -> StartPosition:
        return cls("virtual_queue", offset)

    @classmethod
    def message_count(cls, count: int) -> StartPosition:
        return cls("msgcount", count)

    @classmethod
    def earliest(cls) -> StartPosition:
        """The oldest message the partition still holds (a message count of 0): what a new
        channel, which youzan starts at the end, must be told to read a topic's history."""
        return cls("msgcount", 0)

    @classmethod
    def end(cls) -> StartPosition:
        return cls("special", -1)

    def token(self) -> bytes:
        return f"{self.kind}:{self.value}".encode()


def _line(*tokens: str | bytes) -> bytes:
    return b" ".join(t.encode() if isinstance(t, str) else t for t in tokens) + b"\n"


def _with_partition(name: bytes, topic: str, partition: int | None) -> bytes:
    v.check_topic(topic)
    if partition is not None:
        v.check_partition(partition)
    return _header_line(name, topic, partition)


def _header_line(name: bytes, topic: str, partition: int | None) -> bytes:
    if partition is None:
        return name + b" " + topic.encode() + b"\n"
    return b"%s %s %d\n" % (name, topic.encode(), partition)


def _sized(header: bytes, body: bytes) -> bytes:
    return b"".join((header, _U32.pack(len(body)), body))


# -- handshake -----------------------------------------------------------------------------

def identify(data: Mapping[str, object]) -> bytes:
    """IDENTIFY with a JSON body (build the mapping with ``identify.IdentifyOptions``)."""
    try:
        body = json.dumps(dict(data), separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:  # e.g. an ext_filter holding a non-JSON value
        raise InvalidArgument("IDENTIFY", f"must be JSON-serializable: {exc}") from None
    return _sized(b"IDENTIFY\n", body)


def auth(secret: bytes | str) -> bytes:
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not raw:
        raise InvalidArgument("auth secret", "must not be empty")
    return _sized(b"AUTH\n", raw)


# -- subscribe -----------------------------------------------------------------------------

def sub(topic: str, channel: str, partition: int | None = None) -> bytes:
    v.check_topic(topic)
    v.check_channel(channel)
    if partition is None:
        return _line("SUB", topic, channel)
    return _line("SUB", topic, channel, str(v.check_partition(partition)))


def sub_ordered(topic: str, channel: str, partition: int) -> bytes:
    """SUB_ORDERED (the wire name; the design doc's ``SUB_ORDER`` is rejected by the server)."""
    v.check_topic(topic)
    v.check_channel(channel)
    return _line("SUB_ORDERED", topic, channel, str(v.check_partition(partition)))


def sub_advanced(topic: str, channel: str, partition: int | None = None,
                 start: StartPosition | None = None) -> bytes:
    """SUB_ADVANCED; frames then carry the 12-byte detail block.

    The server reads the partition only when exactly four tokens are sent: with a start
    position it uses the node's default partition (a quirk, docs/protocol.md §3.5), so callers that
    need both should subscribe without a start and set the offset over HTTP.
    """
    v.check_topic(topic)
    v.check_channel(channel)
    tokens: list[str | bytes] = ["SUB_ADVANCED", topic, channel]
    if partition is not None:
        tokens.append(str(v.check_partition(partition)))
    elif start is not None:
        tokens.append("-1")
    if start is not None:
        tokens.append(start.token())
    return _line(*tokens)


def rdy(count: int) -> bytes:
    check_int("rdy", count, 0)
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    """FIN: 21 bytes. ``msg_id`` must be the 16 bytes received (not re-validated on this path)."""
    if len(msg_id) != 16:
        v.check_message_id(msg_id)
    try:
        return b"FIN " + msg_id + b"\n"
    except TypeError:  # a 16-character str: refuse it without slowing the bytes path
        raise v.invalid_message_id(msg_id) from None


def fins(msg_ids: list[bytes]) -> bytes:
    """The FINs of many messages as one payload: one join, not a command each. The ids are
    the 16-byte slices a ``MessageRun`` holds (not re-validated)."""
    if not msg_ids:
        return b""
    return b"FIN " + b"\nFIN ".join(msg_ids) + b"\n"


def req(msg_id: bytes, delay_ms: int = 0) -> bytes:
    if len(msg_id) != 16:
        v.check_message_id(msg_id)
    check_int("requeue delay", delay_ms, 0)
    try:
        return b"REQ " + msg_id + b" %d\n" % delay_ms
    except TypeError:
        raise v.invalid_message_id(msg_id) from None


def touch(msg_id: bytes) -> bytes:
    if len(msg_id) != 16:
        v.check_message_id(msg_id)
    try:
        return b"TOUCH " + msg_id + b"\n"
    except TypeError:
        raise v.invalid_message_id(msg_id) from None


def nop() -> bytes:
    return NOP


def cls() -> bytes:
    return CLS


# -- publish -------------------------------------------------------------------------------

def pub(topic: str, body: bytes, partition: int | None = None,
        max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE) -> bytes:
    v.check_body(body, max_msg_size)
    return _sized(_with_partition(b"PUB", topic, partition), body)


def _batch(name: bytes, topic: str, partition: int | None, parts: Sequence[bytes],
           count: int, max_body_size: int) -> bytes:
    if count == 0:
        raise InvalidArgument("messages", "a batch needs at least one message")
    header = _with_partition(name, topic, partition)
    total = 4 + sum(map(len, parts))
    if total > max_body_size:
        raise InvalidArgument("messages", f"batch size {total} exceeds max_body_size "
                              f"{max_body_size}", f"<{count} messages>")
    return b"".join((header, _U32U32.pack(total, count), *parts))


def mpub(topic: str, bodies: Iterable[bytes], partition: int | None = None,
         max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE,
         max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    pack = _U32.pack
    parts: list[bytes] = []
    append = parts.append
    for body in bodies:
        if not 0 < len(body) <= max_msg_size or not isinstance(body, bytes):
            v.check_body(body, max_msg_size)
        append(pack(len(body)))
        append(body)
    return _batch(b"MPUB", topic, partition, parts, len(parts) // 2, max_body_size)


def dpub(topic: str, delay_ms: int, body: bytes,
         max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE) -> bytes:
    """DPUB (classic nsqd only; youzan nsqd answers ``E_INVALID invalid command``)."""
    v.check_topic(topic)
    check_int("delay", delay_ms, 0)
    v.check_body(body, max_msg_size)
    return dpub_unchecked(topic, delay_ms, body)


def pub_trace(topic: str, body: bytes, trace_id: int, partition: int | None = None,
              max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE) -> bytes:
    v.check_body(body, max_msg_size)
    v.check_trace_id(trace_id)
    header = _with_partition(b"PUB_TRACE", topic, partition)
    return b"".join((header, _U32U64.pack(8 + len(body), trace_id), body))


def mpub_trace(topic: str, messages: Iterable[tuple[int, bytes]], partition: int | None = None,
               max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE,
               max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    parts = []
    for trace_id, body in messages:
        v.check_body(body, max_msg_size)
        v.check_trace_id(trace_id)
        parts.append(_U32U64.pack(8 + len(body), trace_id) + body)
    return _batch(b"MPUB_TRACE", topic, partition, parts, len(parts), max_body_size)


def encode_headers(headers: Mapping[str, str] | None) -> bytes:
    """The ext JSON for PUB_EXT/MPUB_EXT; ``{}`` at minimum (an empty header fails to parse)."""
    if not headers:
        return b"{}"
    v.check_headers(headers)
    try:
        raw = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError as exc:  # a lone surrogate in a value
        raise InvalidArgument("headers", "values must be valid Unicode text",
                              exc.object[exc.start:exc.end]) from None
    if len(raw) > v.MAX_EXT_LENGTH:
        raise InvalidArgument("headers", f"encoded size {len(raw)} exceeds {v.MAX_EXT_LENGTH}",
                              f"<{len(raw)} bytes>")
    return raw


def _ext_part(headers: Mapping[str, str] | None, body: bytes, max_msg_size: int) -> bytes:
    v.check_body(body, max_msg_size)
    return _ext_bytes_part(encode_headers(headers), body)


def _ext_bytes_part(ext: bytes, body: bytes) -> bytes:
    return b"".join((_U32.pack(2 + len(ext) + len(body)), _U16.pack(len(ext)), ext, body))


def ext_with_trace(ext: bytes, trace_id: int) -> bytes:
    """``ext`` (from ``encode_headers``, without a ``##trace_id`` key) plus that key: the
    bytes ``encode_headers({**headers, "##trace_id": str(trace_id)})`` gives, without encoding
    the headers again (a batch shares one encoded mapping and differs only in trace ids)."""
    v.check_trace_id(trace_id)
    tail = b'"%s":"%d"}' % (v.TRACE_ID_HEADER.encode(), trace_id)
    merged = b"{" + tail if ext == b"{}" else ext[:-1] + b"," + tail
    if len(merged) > v.MAX_EXT_LENGTH:
        raise InvalidArgument("headers", f"encoded size {len(merged)} exceeds "
                              f"{v.MAX_EXT_LENGTH}", f"<{len(merged)} bytes>")
    return merged


def pub_ext(topic: str, body: bytes, headers: Mapping[str, str] | None,
            partition: int | None = None,
            max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE) -> bytes:
    """PUB_EXT; a ``##trace_id`` header makes the server answer with the traced response."""
    header = _with_partition(b"PUB_EXT", topic, partition)
    return header + _ext_part(headers, body, max_msg_size)


def mpub_ext(topic: str, messages: Iterable[tuple[Mapping[str, str] | None, bytes]],
             partition: int | None = None,
             max_msg_size: int = v.DEFAULT_MAX_MSG_SIZE,
             max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    parts = [_ext_part(h, b, max_msg_size) for h, b in messages]
    return _batch(b"MPUB_EXT", topic, partition, parts, len(parts), max_body_size)


# -- unchecked publish encoders ------------------------------------------------------------
# For a caller that validated these very values already (see the module docstring): the
# topic (``validate.check_topic``), the partition (``check_partition``) or None, each body
# (non-empty bytes within max_msg_size), trace ids (``check_trace_id``), delays, and ext
# headers encoded by ``encode_headers``/``ext_with_trace``. Batches still check their total
# against ``max_body_size``: the ext JSON adds to it.

def pub_unchecked(topic: str, body: bytes, partition: int | None = None) -> bytes:
    # (one formatting, no helper calls: this runs once per publish)
    if partition is None:
        return b"PUB %s\n%s%s" % (topic.encode(), _U32.pack(len(body)), body)
    return b"PUB %s %d\n%s%s" % (topic.encode(), partition, _U32.pack(len(body)), body)


def dpub_unchecked(topic: str, delay_ms: int, body: bytes) -> bytes:
    return _sized(b"DPUB %s %d\n" % (topic.encode(), delay_ms), body)


def pub_trace_unchecked(topic: str, body: bytes, trace_id: int,
                        partition: int | None = None) -> bytes:
    return b"".join((_header_line(b"PUB_TRACE", topic, partition),
                     _U32U64.pack(8 + len(body), trace_id), body))


def pub_ext_unchecked(topic: str, body: bytes, ext: bytes, partition: int | None = None) -> bytes:
    """PUB_EXT with ``ext`` already encoded (``encode_headers``)."""
    return _header_line(b"PUB_EXT", topic, partition) + _ext_bytes_part(ext, body)


def _batch_unchecked(name: bytes, topic: str, partition: int | None, parts: Sequence[bytes],
                     count: int, max_body_size: int) -> bytes:
    total = 4 + sum(map(len, parts))
    if total > max_body_size:
        raise InvalidArgument("messages", f"batch size {total} exceeds max_body_size "
                              f"{max_body_size}", f"<{count} messages>")
    return b"".join((_header_line(name, topic, partition), _U32U32.pack(total, count), *parts))


def mpub_unchecked(topic: str, bodies: Sequence[bytes], partition: int | None = None,
                   max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    # (no Python-level loop per message: the sizes and the bodies are laid out by slice
    # assignment from C iterators, and one join copies everything once)
    count = len(bodies)
    sizes = list(map(len, bodies))
    total = 4 + 4 * count + sum(sizes)
    if total > max_body_size:
        raise InvalidArgument("messages", f"batch size {total} exceeds max_body_size "
                              f"{max_body_size}", f"<{count} messages>")
    parts: list[bytes] = [b""] * (2 * count + 2)
    parts[0] = _header_line(b"MPUB", topic, partition)
    parts[1] = _U32U32.pack(total, count)
    parts[2::2] = map(_U32.pack, sizes)
    parts[3::2] = bodies
    return b"".join(parts)


def mpub_trace_unchecked(topic: str, messages: Iterable[tuple[int, bytes]],
                         partition: int | None = None,
                         max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    pack = _U32U64.pack
    parts: list[bytes] = []
    append = parts.append
    for trace_id, body in messages:  # (no per-message concatenation: one copy, in the join)
        append(pack(8 + len(body), trace_id))
        append(body)
    return _batch_unchecked(b"MPUB_TRACE", topic, partition, parts, len(parts) // 2,
                            max_body_size)


def mpub_ext_unchecked(topic: str, messages: Iterable[tuple[bytes, bytes]],
                       partition: int | None = None,
                       max_body_size: int = v.DEFAULT_MAX_BODY_SIZE) -> bytes:
    """MPUB_EXT from ``(encoded ext, body)`` pairs; a shared ext is encoded once, by the caller."""
    parts = [_ext_bytes_part(ext, body) for ext, body in messages]
    return _batch_unchecked(b"MPUB_EXT", topic, partition, parts, len(parts), max_body_size)


def command_name(encoded: bytes) -> str:
    """The command word of an encoded command (for error attribution)."""
    end = encoded.find(b" ", 0, 16)
    nl = encoded.find(b"\n", 0, 16)
    if end < 0 or (0 <= nl < end):
        end = nl
    return encoded[:end].decode("ascii", "replace")
