"""pynsq's ``nsq.protocol``: its errors, frame types, command builders and decoders.

The builders return the wire bytes nsqd reads, built by smartnsq's codec
(:mod:`smartnsq.protocol.commands`), for a program that writes its own commands to an
``AsyncConn`` or ``SyncConn``. A bad argument raises
:class:`~smartnsq.errors.InvalidArgumentAssertion`: an ``AssertionError``, as pynsq's
``assert`` raises, that is also smartnsq's ``InvalidArgument`` with its field and rule.

The errors are pynsq's: ``Error`` and its subclasses. The smartnsq exception behind one, when
there is one, is its ``error`` attribute.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping
from typing import Any, ParamSpec, TypeVar

from smartnsq.errors import InvalidArgument, InvalidArgumentAssertion
from smartnsq.protocol import commands, frames, validate

from .message import Message

__all__ = [
    "AUTH",
    "DPUB",
    "FIN",
    "FRAME_TYPE_ERROR",
    "FRAME_TYPE_MESSAGE",
    "FRAME_TYPE_RESPONSE",
    "IDENTIFY",
    "MAGIC_V2",
    "MPUB",
    "NL",
    "NOP",
    "PUB",
    "RDY",
    "REQ",
    "SUB",
    "TOUCH",
    "ConnectionClosedError",
    "Error",
    "IntegrityError",
    "SendError",
    "auth",
    "decode_message",
    "dpub",
    "finish",
    "identify",
    "mpub",
    "nop",
    "pub",
    "ready",
    "requeue",
    "subscribe",
    "touch",
    "unpack_response",
    "valid_channel_name",
    "valid_topic_name",
]

T = TypeVar("T")
P = ParamSpec("P")

MAGIC_V2 = commands.MAGIC_V2
NL = b"\n"

FRAME_TYPE_RESPONSE = frames.FRAME_RESPONSE
FRAME_TYPE_ERROR = frames.FRAME_ERROR
FRAME_TYPE_MESSAGE = frames.FRAME_MESSAGE

# the command words, as pynsq names them
AUTH = b"AUTH"
DPUB = b"DPUB"
FIN = b"FIN"
IDENTIFY = b"IDENTIFY"
MPUB = b"MPUB"
NOP = b"NOP"
PUB = b"PUB"
RDY = b"RDY"
REQ = b"REQ"
SUB = b"SUB"
TOUCH = b"TOUCH"

_FRAME_TYPE = struct.Struct(">i")


class Error(Exception):
    """pynsq's ``nsq.Error``: what a publish callback gets instead of ``b"OK"``, what an
    ``AsyncConn``'s ``error`` event carries.

    ``msg`` is the text; ``error`` the smartnsq exception behind it (``Timeout``,
    ``ServerError``...), or None.
    """

    def __init__(self, msg: object = "", error: BaseException | None = None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error = error


class SendError(Error):
    """A command could not be delivered, or was refused (pynsq's ``nsq.protocol.SendError``)."""


class ConnectionClosedError(Error):
    """The connection closed under the command (pynsq's name)."""


class IntegrityError(Error):
    """The server's answer could not be read (pynsq's name)."""


def asserting(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` raising :class:`InvalidArgumentAssertion` where smartnsq raised
    ``InvalidArgument`` (the same fields and message, and the traceback of the check): pynsq
    checks its arguments with ``assert``, so pynsq programs catch ``AssertionError``."""

    @functools.wraps(fn)
    def checked(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except InvalidArgumentAssertion:
            raise
        except InvalidArgument as exc:
            error = InvalidArgumentAssertion(exc.field, exc.rule, exc.value)
            raise error.with_traceback(exc.__traceback__) from None

    return checked


def raw_id(message_id: bytes | str) -> bytes:
    """A message id as the wire wants it: the 16 bytes received. A Reader's text id (the 16
    characters of a classic id, the 32 hex digits of a youzan one) is turned back."""
    if isinstance(message_id, bytes | bytearray | memoryview):
        return bytes(message_id)
    if isinstance(message_id, str):
        if len(message_id) == 32:
            try:
                return bytes.fromhex(message_id)
            except ValueError:
                pass
        return message_id.encode("ascii", "replace")
    raise InvalidArgument("message id", "must be bytes or str", message_id)


def _body(data: bytes | str) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if not isinstance(data, bytes):
        raise InvalidArgument("body", "must be bytes", data)
    return data


def unpack_response(data: bytes) -> tuple[int, bytes]:
    """A frame's payload (what follows its size) as ``(frame type, data)``."""
    return _FRAME_TYPE.unpack_from(data)[0], data[4:]


def decode_message(data: bytes) -> Message:
    """A message frame's data (what follows its frame type) as a :class:`Message`, decoded by
    smartnsq's frame reader in nsqd's classic layout; ``id`` is the 16 bytes, as in pynsq."""
    frame = frames.FrameReader(frames.CLASSIC_LAYOUT).feed(
        frames.encode_frame(frames.FRAME_MESSAGE, bytes(data)))[0]
    assert isinstance(frame, frames.MessageFrame)
    return Message(frame.id, frame.body, frame.timestamp, frame.attempts)


@asserting
def subscribe(topic: str, channel: str) -> bytes:
    return commands.sub(topic, channel)


@asserting
def identify(data: Mapping[str, Any]) -> bytes:
    return commands.identify(data)


@asserting
def auth(data: bytes | str) -> bytes:
    return commands.auth(data)


@asserting
def ready(count: int) -> bytes:
    return commands.rdy(count)


@asserting
def finish(id: bytes | str) -> bytes:
    return commands.fin(raw_id(id))


@asserting
def requeue(id: bytes | str, time_ms: int = 0) -> bytes:
    return commands.req(raw_id(id), time_ms)


@asserting
def touch(id: bytes | str) -> bytes:
    return commands.touch(raw_id(id))


def nop() -> bytes:
    return commands.nop()


@asserting
def pub(topic: str, data: bytes | str) -> bytes:
    return commands.pub(topic, _body(data))


@asserting
def mpub(topic: str, data: list[bytes] | set[bytes]) -> bytes:
    if not isinstance(data, list | set | tuple):
        raise InvalidArgument("data", "must be a list of message bodies", data)
    return commands.mpub(topic, [_body(body) for body in data])


@asserting
def dpub(topic: str, delay_ms: int, data: bytes | str) -> bytes:
    return commands.dpub(topic, delay_ms, _body(data))


def valid_topic_name(topic: str) -> bool:
    """Whether nsqd takes this topic name (1..64 of ``[.a-zA-Z0-9_-]``, ``#ephemeral``)."""
    try:
        validate.check_topic(topic)
    except InvalidArgument:
        return False
    return True


def valid_channel_name(channel: str) -> bool:
    """Whether nsqd takes this channel name (the rule of topic names)."""
    try:
        validate.check_channel(channel)
    except InvalidArgument:
        return False
    return True
