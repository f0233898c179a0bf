"""Incremental parsing of the client-to-server stream, as nsqd reads it.

The server side of the protocol (docs/protocol.md §3.1, §3.2) is pull-driven: nsqd reads a
command line, and the command's handler then decides what to read next (a 4-byte length, a
body of that length, an MPUB's count and items...) and what to check in between. The checks are
interleaved with the reads: a PUB whose length prefix is too large is refused before a single
body byte arrives, and a non-fatal error in the middle of an MPUB leaves the unread rest of the
body in the stream to be read as commands. ``CommandReader`` keeps that shape without any I/O:

* ``feed(data)`` adds received bytes;
* ``next_event()`` returns the next complete unit, or ``None`` when more bytes are needed:
  first a :class:`Magic`, then :class:`Line` events, and, only when the handler asked for one
  with ``expect_int32()`` / ``expect_bytes(n)``, a single :class:`Int32` or :class:`Data`;
* ``take_buffered()`` hands back the bytes received but not parsed yet, for the point where
  a connection switches its byte stream (snappy or deflate after IDENTIFY).

Line splitting follows the server flavour. Classic nsqd splits every line on single spaces
after trimming ``\\n`` and an optional ``\\r``. Youzan nsqd does that too, except for FIN, REQ
and TOUCH, whose 16-byte message ids are raw binary and may contain ``\\n`` or spaces: it
slices them at fixed offsets, reading past an early ``\\n`` until it has the fixed length
(``YS nsqdserver/protocol_v2.go#IOLoop``).
"""

from __future__ import annotations

from typing import Final, Union

__all__ = [
    "DEFAULT_MAX_LINE",
    "MAGIC_V2",
    "CommandReader",
    "Data",
    "Event",
    "Int32",
    "Line",
    "LineTooLong",
    "Magic",
]

MAGIC_V2: Final = b"  V2"
# Go's bufio.Reader gives up (ErrBufferFull) on a line longer than its buffer; nsqd then
# drops the connection without an error frame
DEFAULT_MAX_LINE: Final = 16 * 1024

_SEP: Final = b" "
_SPECIAL_FIRST: Final = frozenset(b"FRT")  # FIN, REQ, TOUCH
_COMPACT_AT: Final = 64 * 1024

_MODE_MAGIC: Final = 0
_MODE_LINE: Final = 1
_MODE_INT32: Final = 2
_MODE_BYTES: Final = 3


class Magic:
    """The 4 bytes a connection starts with; ``ok`` when they are ``"  V2"``."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @property
    def ok(self) -> bool:
        return self.data == MAGIC_V2

    def __repr__(self) -> str:
        return f"Magic({self.data!r})"


class Line:
    """One command line, split as the server splits it.

    ``params[0]`` is the command name (Go's ``params`` slice); ``raw`` is the line as read,
    terminator included.
    """

    __slots__ = ("params", "raw")

    def __init__(self, params: list[bytes], raw: bytes) -> None:
        self.params = params
        self.raw = raw

    @property
    def name(self) -> bytes:
        return self.params[0]

    def __repr__(self) -> str:
        return f"Line({self.params!r})"


class Int32:
    """A 4-byte big-endian signed integer the handler asked for (a length or a count)."""

    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Int32({self.value})"


class Data:
    """Exactly the number of bytes the handler asked for."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        shown = self.data[:32]
        return f"Data({shown!r}{'...' if len(self.data) > 32 else ''})"


class LineTooLong:
    """No ``\\n`` within ``max_line`` bytes: the server gives up on the connection."""

    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length

    def __repr__(self) -> str:
        return f"LineTooLong({self.length})"


Event = Union[Magic, Line, Int32, Data, LineTooLong]  # noqa: UP007 - runtime alias on 3.10


class CommandReader:
    """Sans-I/O reader of what a client sends to nsqd.

    ``binary_ids`` selects youzan's fixed-offset slicing of FIN/REQ/TOUCH (classic nsqd
    splits them like any other line). ``expect_magic=False`` starts directly with command
    lines. After :class:`LineTooLong` the reader stops producing events.
    """

    __slots__ = ("_binary_ids", "_broken", "_buf", "_max_line", "_mode", "_need", "_pos")

    def __init__(self, *, binary_ids: bool = True, expect_magic: bool = True,
                 max_line: int = DEFAULT_MAX_LINE) -> None:
        self._binary_ids = binary_ids
        self._max_line = max_line
        self._buf = bytearray()
        self._pos = 0
        self._mode = _MODE_MAGIC if expect_magic else _MODE_LINE
        self._need = 0
        self._broken = False

    # -- input ------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        buf = self._buf
        if self._pos:
            if self._pos == len(buf):
                buf.clear()
                self._pos = 0
            elif self._pos >= _COMPACT_AT:
                del buf[:self._pos]
                self._pos = 0
        buf += data

    @property
    def buffered(self) -> int:
        """Bytes received and not parsed yet."""
        return len(self._buf) - self._pos

    def take_buffered(self) -> bytes:
        """Remove and return the bytes not parsed yet (the parse state is kept)."""
        data = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return data

    # -- what the handler wants next ------------------------------------------------------

    def expect_int32(self) -> None:
        """The next event is an :class:`Int32` (then back to lines)."""
        self._mode = _MODE_INT32

    def expect_bytes(self, n: int) -> None:
        """The next event is :class:`Data` of exactly ``n`` bytes (then back to lines)."""
        if n < 0:
            raise ValueError("cannot read a negative number of bytes")
        self._mode = _MODE_BYTES
        self._need = n

    def expect_line(self) -> None:
        """Abandon an expected length or body and read command lines again."""
        self._mode = _MODE_LINE

    @property
    def expecting_line(self) -> bool:
        return self._mode == _MODE_LINE

    # -- output -----------------------------------------------------------------------------

    def next_event(self) -> Event | None:
        if self._broken:
            return None
        mode = self._mode
        if mode == _MODE_LINE:
            return self._line()
        buf = self._buf
        pos = self._pos
        if mode == _MODE_INT32:
            if len(buf) - pos < 4:
                return None
            self._pos = pos + 4
            self._mode = _MODE_LINE
            return Int32(int.from_bytes(buf[pos:pos + 4], "big", signed=True))
        if mode == _MODE_BYTES:
            end = pos + self._need
            if len(buf) < end:
                return None
            self._pos = end
            self._mode = _MODE_LINE
            return Data(bytes(buf[pos:end]))
        # magic
        if len(buf) - pos < 4:
            return None
        self._pos = pos + 4
        self._mode = _MODE_LINE
        return Magic(bytes(buf[pos:pos + 4]))

    def _line(self) -> Line | LineTooLong | None:
        buf = self._buf
        pos = self._pos
        nl = buf.find(b"\n", pos)
        if nl < 0:
            if len(buf) - pos > self._max_line:
                self._broken = True
                return LineTooLong(len(buf) - pos)
            return None
        if nl - pos >= self._max_line:
            self._broken = True
            return LineTooLong(nl - pos + 1)
        if self._binary_ids and nl - pos >= 2 and buf[pos] in _SPECIAL_FIRST:
            handled, special = self._special(buf, pos, nl)
            if handled:
                return special
        raw = bytes(buf[pos:nl + 1])
        self._pos = nl + 1
        line = raw[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
        return Line(line.split(_SEP), raw)

    def _special(self, buf: bytearray, pos: int, nl: int) -> tuple[bool, Line | None]:
        """Youzan's FIN/REQ/TOUCH: ids sliced at fixed offsets (docs/protocol.md §3.2).

        Returns ``(False, None)`` for any other line, ``(True, None)`` when the fixed-length
        line is not complete yet.
        """
        length = nl - pos + 1
        head = bytes(buf[pos:pos + 3])
        if head in (b"FIN", b"REQ"):
            if length < 21:
                # read up to 20 bytes, then on to the next newline
                if len(buf) - pos < 20:
                    return True, None
                end_nl = buf.find(b"\n", pos + 20)
                if end_nl < 0:
                    return True, None
                nl = end_nl
            raw = bytes(buf[pos:nl + 1])
            self._pos = nl + 1
            params = [raw[:3]]
            if len(raw) >= 21:
                params.append(raw[4:20])
                if head == b"REQ" and len(raw) >= 22:
                    params.append(raw[21:-1])
            return True, Line(params, raw)
        if length >= 5 and bytes(buf[pos:pos + 5]) == b"TOUCH":
            end = nl + 1
            if length < 23:
                # exactly 23 bytes, however many newlines they hold
                if len(buf) - pos < 23:
                    return True, None
                end = pos + 23
            raw = bytes(buf[pos:end])
            self._pos = end
            params = [raw[:5]]
            if len(raw) >= 23:
                params.append(raw[6:22])
            return True, Line(params, raw)
        return False, None
